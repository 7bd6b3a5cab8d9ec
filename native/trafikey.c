/* trafikey: echomq's transitions as native commands (EMQ.*), replies byte-identical to the
 * Lua scripts in src/echomq/lua. See README.md for the calling convention. The command
 * table (names, forms, KEYS/ARGV counts, arity errors) is commands.gen.h, generated from the
 * scripts' headers by scripts/gen-native. */
#define RMAPI_DEFINE
#include "emq.h"

/* flags, by what each command may do at maxmemory (the server's noeviction policy), as the
 * Lua twin is treated there: only an admission grows memory and is refused whole
 * ("deny-oom": nothing written; a header's `Native: ... deny-oom`). Every other command
 * settles, moves or frees jobs and must never be refused for memory (completing is what
 * frees it): the scripts' first write there does not grow memory (ZPOPMIN, ZREM, HDEL), so
 * the server lets them run, and the heartbeats run with allow-oom (protocol/scripts.py). */
#define EMQ_GROWS "write deny-oom getkeys-api"
#define EMQ_FREES "write getkeys-api"

#define TRAFIKEY_COMMAND_TABLE
#include "commands.gen.h"

static const RedisModuleCommandInfoVersion INFO_VERSION = {
    1, sizeof(RedisModuleCommandHistoryEntry), sizeof(RedisModuleCommandKeySpec),
    sizeof(RedisModuleCommandArg)};

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (rmapi_init(ctx, "trafikey", TRAFIKEY_VERSION, REDISMODULE_APIVER_1) != REDISMODULE_OK)
        return REDISMODULE_ERR;
    /* A key the module opens for writing is signalled modified (WATCH, client-side caching)
     * by emq.c when it was written, not on every close: a write handle can then serve the
     * read that decides whether to write (one key lookup, not two). */
    RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
    for (size_t i = 0; i < sizeof(EMQ_COMMANDS) / sizeof(EMQ_COMMANDS[0]); i++) {
        /* getkeys-api: Redis 7.0 slot-checks a module command (CROSSSLOT, MOVED, ASK) only
         * when it can list its keys through the module; the key spec alone is not used for
         * routing there. emq_run answers the position request. */
        if (RedisModule_CreateCommand(ctx, EMQ_COMMANDS[i].name, EMQ_COMMANDS[i].fn,
                                      EMQ_COMMANDS[i].flags, 0, 0, 0) != REDISMODULE_OK)
            return REDISMODULE_ERR;
        RedisModuleCommand *cmd = RedisModule_GetCommand(ctx, EMQ_COMMANDS[i].name);
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
        info.summary = EMQ_COMMANDS[i].summary;
        info.arity = -3;
        info.key_specs = specs;
        if (RedisModule_SetCommandInfo(cmd, &info) != REDISMODULE_OK) return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}
