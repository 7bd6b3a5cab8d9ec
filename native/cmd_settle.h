/* cmd_settle.h: EMQ.SETTLE's shape (cmd_settle.c), the twin of settle.lua. */
#ifndef TRAFIKEY_CMD_SETTLE_H
#define TRAFIKEY_CMD_SETTLE_H

#include "emq.h"

emq_body emq_settle_shape(int nkeys, int nargs, const char **why);

#endif
