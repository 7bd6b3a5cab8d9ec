/* rmapi.h: our own declarations of the slice of the Redis/Valkey module API that trafikey
 * uses, written from the documented API (no server header is vendored). Everything here
 * exists in Redis 7.0 and Valkey 8: key specs (SetCommandInfo) are the newest thing used.
 *
 * How loading works: the server hands OnLoad a context whose first pointer is its GetApi
 * function; rmapi_init() asks it for each function below by its exported name
 * ("RedisModule_<Name>") and stores it in the matching pointer. */
#ifndef TRAFIKEY_RMAPI_H
#define TRAFIKEY_RMAPI_H

#include <stddef.h>
#include <stdint.h>

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1

/* Reply types of RedisModule_CallReplyType (RESP2 replies: we never ask for RESP3). */
#define REDISMODULE_REPLY_UNKNOWN (-1)
#define REDISMODULE_REPLY_STRING 0
#define REDISMODULE_REPLY_ERROR 1
#define REDISMODULE_REPLY_INTEGER 2
#define REDISMODULE_REPLY_ARRAY 3
#define REDISMODULE_REPLY_NULL 4

/* Key spec flags (what a command does with a key) and search types. */
#define REDISMODULE_CMD_KEY_RO (1ULL << 0)
#define REDISMODULE_CMD_KEY_RW (1ULL << 1)
#define REDISMODULE_CMD_KEY_ACCESS (1ULL << 4)
#define REDISMODULE_CMD_KEY_UPDATE (1ULL << 5)

typedef enum {
    REDISMODULE_KSPEC_BS_INVALID = 0,
    REDISMODULE_KSPEC_BS_UNKNOWN,
    REDISMODULE_KSPEC_BS_INDEX,
    REDISMODULE_KSPEC_BS_KEYWORD
} RedisModuleKeySpecBeginSearchType;

typedef enum {
    REDISMODULE_KSPEC_FK_OMITTED = 0,
    REDISMODULE_KSPEC_FK_UNKNOWN,
    REDISMODULE_KSPEC_FK_RANGE,
    REDISMODULE_KSPEC_FK_KEYNUM
} RedisModuleKeySpecFindKeysType;

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef struct RedisModuleCommand RedisModuleCommand;

typedef struct RedisModuleKey RedisModuleKey;

/* The key API: open modes, key types, HashGet flags. */
#define REDISMODULE_READ (1 << 0)
#define REDISMODULE_WRITE (1 << 1)
#define REDISMODULE_KEYTYPE_EMPTY 0
#define REDISMODULE_KEYTYPE_STRING 1
#define REDISMODULE_KEYTYPE_LIST 2
#define REDISMODULE_KEYTYPE_HASH 3
#define REDISMODULE_KEYTYPE_SET 4
#define REDISMODULE_KEYTYPE_ZSET 5
#define REDISMODULE_LIST_HEAD 0
#define REDISMODULE_LIST_TAIL 1
#define REDISMODULE_HASH_NONE 0
#define REDISMODULE_HASH_CFIELDS (1 << 2)
#define REDISMODULE_HASH_EXISTS (1 << 3)

typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

/* The command-info structures: the server reads them through the sizes in the version
 * record, so their layout must match the documented one field for field. */
typedef struct {
    int version;
    size_t sizeof_historyentry;
    size_t sizeof_keyspec;
    size_t sizeof_arg;
} RedisModuleCommandInfoVersion;

typedef struct {
    const char *since;
    const char *changes;
} RedisModuleCommandHistoryEntry;

typedef struct {
    const char *notes;
    uint64_t flags;
    RedisModuleKeySpecBeginSearchType begin_search_type;
    union {
        struct { int pos; } index;
        struct { const char *keyword; int startfrom; } keyword;
    } bs;
    RedisModuleKeySpecFindKeysType find_keys_type;
    union {
        struct { int lastkey; int keystep; int limit; } range;
        struct { int keynumidx; int firstkey; int keystep; } keynum;
    } fk;
} RedisModuleCommandKeySpec;

typedef struct RedisModuleCommandArg {
    const char *name;
    int type;
    int key_spec_index;
    const char *token;
    const char *summary;
    const char *since;
    int flags;
    const char *deprecated_since;
    struct RedisModuleCommandArg *subargs;
} RedisModuleCommandArg;

typedef struct {
    const RedisModuleCommandInfoVersion *version;
    const char *summary;
    const char *complexity;
    const char *since;
    RedisModuleCommandHistoryEntry *history;
    const char *tips;
    int arity;
    RedisModuleCommandKeySpec *key_specs;
    RedisModuleCommandArg *args;
} RedisModuleCommandInfo;

/* The function pointers (defined once in rmapi.c-less style: RMAPI_DEFINE in trafikey.c). */
#ifdef RMAPI_DEFINE
#define RMAPI_EXTERN
#else
#define RMAPI_EXTERN extern
#endif

RMAPI_EXTERN int (*RedisModule_GetApi)(const char *name, void *out);
RMAPI_EXTERN int (*RedisModule_SetModuleAttribs)(RedisModuleCtx *ctx, const char *name, int ver,
                                                 int apiver);
RMAPI_EXTERN int (*RedisModule_IsModuleNameBusy)(const char *name);
RMAPI_EXTERN int (*RedisModule_CreateCommand)(RedisModuleCtx *ctx, const char *name,
                                              RedisModuleCmdFunc fn, const char *flags,
                                              int firstkey, int lastkey, int keystep);
RMAPI_EXTERN RedisModuleCommand *(*RedisModule_GetCommand)(RedisModuleCtx *ctx, const char *name);
RMAPI_EXTERN int (*RedisModule_SetCommandInfo)(RedisModuleCommand *command,
                                               const RedisModuleCommandInfo *info);
RMAPI_EXTERN void (*RedisModule_AutoMemory)(RedisModuleCtx *ctx);
RMAPI_EXTERN long long (*RedisModule_Milliseconds)(void);
RMAPI_EXTERN RedisModuleCallReply *(*RedisModule_Call)(RedisModuleCtx *ctx, const char *cmd,
                                                        const char *fmt, ...);
RMAPI_EXTERN int (*RedisModule_CallReplyType)(RedisModuleCallReply *reply);
RMAPI_EXTERN long long (*RedisModule_CallReplyInteger)(RedisModuleCallReply *reply);
RMAPI_EXTERN size_t (*RedisModule_CallReplyLength)(RedisModuleCallReply *reply);
RMAPI_EXTERN RedisModuleCallReply *(*RedisModule_CallReplyArrayElement)(
    RedisModuleCallReply *reply, size_t idx);
RMAPI_EXTERN const char *(*RedisModule_CallReplyStringPtr)(RedisModuleCallReply *reply,
                                                            size_t *len);
RMAPI_EXTERN RedisModuleString *(*RedisModule_CreateString)(RedisModuleCtx *ctx, const char *ptr,
                                                             size_t len);
RMAPI_EXTERN const char *(*RedisModule_StringPtrLen)(const RedisModuleString *str, size_t *len);
RMAPI_EXTERN int (*RedisModule_ReplyWithError)(RedisModuleCtx *ctx, const char *err);
RMAPI_EXTERN int (*RedisModule_ReplyWithLongLong)(RedisModuleCtx *ctx, long long ll);
RMAPI_EXTERN int (*RedisModule_ReplyWithStringBuffer)(RedisModuleCtx *ctx, const char *buf,
                                                      size_t len);
RMAPI_EXTERN int (*RedisModule_ReplyWithArray)(RedisModuleCtx *ctx, long len);
RMAPI_EXTERN void *(*RedisModule_PoolAlloc)(RedisModuleCtx *ctx, size_t bytes);
/* The key API (reads on the hot paths: no fake client, no argv, no reply object). */
RMAPI_EXTERN RedisModuleKey *(*RedisModule_OpenKey)(RedisModuleCtx *ctx, RedisModuleString *name,
                                                     int mode);
RMAPI_EXTERN void (*RedisModule_CloseKey)(RedisModuleKey *key);
RMAPI_EXTERN int (*RedisModule_KeyType)(RedisModuleKey *key);
RMAPI_EXTERN size_t (*RedisModule_ValueLength)(RedisModuleKey *key);
RMAPI_EXTERN int (*RedisModule_HashGet)(RedisModuleKey *key, int flags, ...);
RMAPI_EXTERN RedisModuleString *(*RedisModule_ListGet)(RedisModuleKey *key, long index);
RMAPI_EXTERN int (*RedisModule_HashSet)(RedisModuleKey *key, int flags, ...);
RMAPI_EXTERN int (*RedisModule_ZsetAdd)(RedisModuleKey *key, double score, RedisModuleString *ele,
                                        int *flagsptr);
RMAPI_EXTERN int (*RedisModule_ZsetRem)(RedisModuleKey *key, RedisModuleString *ele,
                                        int *deleted);
RMAPI_EXTERN int (*RedisModule_ZsetScore)(RedisModuleKey *key, RedisModuleString *ele,
                                          double *score);
RMAPI_EXTERN int (*RedisModule_DeleteKey)(RedisModuleKey *key);
RMAPI_EXTERN int (*RedisModule_ListPush)(RedisModuleKey *key, int where, RedisModuleString *ele);
RMAPI_EXTERN RedisModuleString *(*RedisModule_ListPop)(RedisModuleKey *key, int where);
RMAPI_EXTERN int (*RedisModule_ZsetFirstInScoreRange)(RedisModuleKey *key, double min, double max,
                                                       int minex, int maxex);
RMAPI_EXTERN RedisModuleString *(*RedisModule_ZsetRangeCurrentElement)(RedisModuleKey *key,
                                                                       double *score);
RMAPI_EXTERN int (*RedisModule_ZsetRangeNext)(RedisModuleKey *key);
RMAPI_EXTERN void (*RedisModule_ZsetRangeStop)(RedisModuleKey *key);
RMAPI_EXTERN int (*RedisModule_ListSet)(RedisModuleKey *key, long index, RedisModuleString *value);
RMAPI_EXTERN int (*RedisModule_Replicate)(RedisModuleCtx *ctx, const char *cmdname,
                                          const char *fmt, ...);
/* The module signals the keys it writes itself (emq.c): a key opened for writing is not
 * signalled modified on close (REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED). */
#define REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED (1 << 1)
RMAPI_EXTERN void (*RedisModule_SetModuleOptions)(RedisModuleCtx *ctx, int options);
RMAPI_EXTERN int (*RedisModule_SignalModifiedKey)(RedisModuleCtx *ctx, RedisModuleString *keyname);
RMAPI_EXTERN void (*RedisModule_FreeString)(RedisModuleCtx *ctx, RedisModuleString *str);
/* getkeys-api: the server asks the command itself where its keys are (cluster routing). */
RMAPI_EXTERN int (*RedisModule_IsKeysPositionRequest)(RedisModuleCtx *ctx);
RMAPI_EXTERN void (*RedisModule_KeyAtPos)(RedisModuleCtx *ctx, int pos);

/* Fetch every pointer above through the server's GetApi and register the module's name.
 * Returns REDISMODULE_ERR when a function is missing (too old a server) or the name is taken. */
static inline int rmapi_init(RedisModuleCtx *ctx, const char *name, int ver, int apiver) {
    void *getapi = ((void **)ctx)[0];
    /* Converting an object pointer to a function pointer is what the API mandates here. */
    *(void **)&RedisModule_GetApi = getapi;
#define RMAPI_GET(fn)                                                                        \
    if (RedisModule_GetApi("RedisModule_" #fn, (void *)&RedisModule_##fn) != REDISMODULE_OK) \
        return REDISMODULE_ERR;
    RMAPI_GET(SetModuleAttribs)
    RMAPI_GET(IsModuleNameBusy)
    RMAPI_GET(CreateCommand)
    RMAPI_GET(GetCommand)
    RMAPI_GET(SetCommandInfo)
    RMAPI_GET(AutoMemory)
    RMAPI_GET(Milliseconds)
    RMAPI_GET(Call)
    RMAPI_GET(CallReplyType)
    RMAPI_GET(CallReplyInteger)
    RMAPI_GET(CallReplyLength)
    RMAPI_GET(CallReplyArrayElement)
    RMAPI_GET(CallReplyStringPtr)
    RMAPI_GET(CreateString)
    RMAPI_GET(StringPtrLen)
    RMAPI_GET(ReplyWithError)
    RMAPI_GET(ReplyWithLongLong)
    RMAPI_GET(ReplyWithStringBuffer)
    RMAPI_GET(ReplyWithArray)
    RMAPI_GET(PoolAlloc)
    RMAPI_GET(IsKeysPositionRequest)
    RMAPI_GET(OpenKey)
    RMAPI_GET(CloseKey)
    RMAPI_GET(KeyType)
    RMAPI_GET(ValueLength)
    RMAPI_GET(HashGet)
    RMAPI_GET(ListGet)
    RMAPI_GET(HashSet)
    RMAPI_GET(ZsetAdd)
    RMAPI_GET(ZsetRem)
    RMAPI_GET(ZsetScore)
    RMAPI_GET(DeleteKey)
    RMAPI_GET(ListPush)
    RMAPI_GET(ListPop)
    RMAPI_GET(ZsetFirstInScoreRange)
    RMAPI_GET(ZsetRangeCurrentElement)
    RMAPI_GET(ZsetRangeNext)
    RMAPI_GET(ZsetRangeStop)
    RMAPI_GET(ListSet)
    RMAPI_GET(Replicate)
    RMAPI_GET(SetModuleOptions)
    RMAPI_GET(SignalModifiedKey)
    RMAPI_GET(FreeString)
    RMAPI_GET(KeyAtPos)
#undef RMAPI_GET
    if (RedisModule_IsModuleNameBusy(name)) return REDISMODULE_ERR;
    RedisModule_SetModuleAttribs(ctx, name, ver, apiver);
    return REDISMODULE_OK;
}

#endif
