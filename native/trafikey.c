/* trafikey: echomq's transitions as native commands (EMQ.*), replies byte-identical to the
 * Lua scripts in src/echomq/lua. See README.md for the calling convention. */
#define RMAPI_DEFINE
#include "emq.h"
#include "settle.h"
#include "lease.h"
#include "cmd_settle.h"

static int cmd_enqueue(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return emq_run(ctx, argv, argc, emq_enqueue_shape);
}

static int cmd_extend(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return emq_run(ctx, argv, argc, emq_extend_shape);
}

static int cmd_reprocess(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return emq_run(ctx, argv, argc, emq_reprocess_shape);
}

static int cmd_claim(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return emq_run(ctx, argv, argc, emq_claim_shape);
}

static int cmd_settle_verbs(RedisModuleCtx *ctx, RedisModuleString **argv, int argc,
                            emq_shape shape) {
    return emq_run(ctx, argv, argc, shape);
}
static int cmd_complete(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return cmd_settle_verbs(ctx, argv, argc, emq_complete_shape);
}
static int cmd_retry(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return cmd_settle_verbs(ctx, argv, argc, emq_retry_shape);
}
static int cmd_sweep(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return cmd_settle_verbs(ctx, argv, argc, emq_sweep_shape);
}
static int cmd_settle(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return emq_run(ctx, argv, argc, emq_settle_shape);
}

/* flags, by what each command may do at maxmemory (the server's noeviction policy), as the
 * Lua twin is treated there: only an admission grows memory and is refused whole
 * ("deny-oom": nothing written). Every other command settles, moves or frees jobs and must
 * never be refused for memory (completing is what frees it): the scripts' first write there
 * does not grow memory (ZPOPMIN, ZREM, HDEL), so the server lets them run, and the
 * heartbeats run with allow-oom (_scripts.py). */
#define EMQ_GROWS "write deny-oom getkeys-api"
#define EMQ_FREES "write getkeys-api"

static const struct {
    const char *name;
    RedisModuleCmdFunc fn;
    const char *flags;
    const char *summary;
} COMMANDS[] = {
    {"emq.enqueue", cmd_enqueue, EMQ_GROWS, "enqueue.lua (2 keys) / enqueue_many.lua (1 key)"},
    {"emq.extend", cmd_extend, EMQ_FREES, "extend.lua (2 keys) / extend_many.lua (1 key)"},
    {"emq.reprocess", cmd_reprocess, EMQ_FREES, "reprocess.lua"},
    {"emq.complete", cmd_complete, EMQ_FREES, "complete.lua"},
    {"emq.retry", cmd_retry, EMQ_FREES, "retry.lua"},
    {"emq.sweep", cmd_sweep, EMQ_FREES, "sweep_stalled.lua"},
    {"emq.claim", cmd_claim, EMQ_FREES,
     "claim.lua (3 keys, 2 args) / claim_batch.lua (3 keys, 3 args)"},
    {"emq.settle", cmd_settle, EMQ_FREES, "settle.lua (5 keys)"},
};

static const RedisModuleCommandInfoVersion INFO_VERSION = {
    1, sizeof(RedisModuleCommandHistoryEntry), sizeof(RedisModuleCommandKeySpec),
    sizeof(RedisModuleCommandArg)};

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (rmapi_init(ctx, "trafikey", TRAFIKEY_VERSION, REDISMODULE_APIVER_1) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++) {
        /* getkeys-api: Redis 7.0 slot-checks a module command (CROSSSLOT, MOVED, ASK) only
         * when it can list its keys through the module; the key spec alone is not used for
         * routing there. emq_run answers the position request. */
        if (RedisModule_CreateCommand(ctx, COMMANDS[i].name, COMMANDS[i].fn, COMMANDS[i].flags,
                                      0, 0, 0) != REDISMODULE_OK)
            return REDISMODULE_ERR;
        RedisModuleCommand *cmd = RedisModule_GetCommand(ctx, COMMANDS[i].name);
        if (!cmd) return REDISMODULE_ERR;
        /* Like EVAL: numkeys at index 1, the keys right after it. */
        RedisModuleCommandKeySpec specs[2] = {{0}, {0}};
        specs[0].flags = REDISMODULE_CMD_KEY_RW | REDISMODULE_CMD_KEY_ACCESS |
                         REDISMODULE_CMD_KEY_UPDATE;
        specs[0].begin_search_type = REDISMODULE_KSPEC_BS_INDEX;
        specs[0].bs.index.pos = 1;
        specs[0].find_keys_type = REDISMODULE_KSPEC_FK_KEYNUM;
        specs[0].fk.keynum.keynumidx = 0;
        specs[0].fk.keynum.firstkey = 1;
        specs[0].fk.keynum.keystep = 1;
        RedisModuleCommandInfo info = {0};
        info.version = &INFO_VERSION;
        info.summary = COMMANDS[i].summary;
        info.arity = -3;
        info.key_specs = specs;
        if (RedisModule_SetCommandInfo(cmd, &info) != REDISMODULE_OK) return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}
