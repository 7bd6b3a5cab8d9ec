/* compose.h: the C twins of the flow (D18) functions of src/echomq/lua/include/compose.lua that
 * the settles use: flow_parent, flow_of, flow_outbox, cross_queue, flow_release,
 * flow_settled, flow_child_done, flow_child_dead, flow_forget. Used by cmd_complete.c,
 * cmd_retry.c, cmd_sweep_stalled.c and (through settle.h) EMQ.SETTLE. */
#ifndef TRAFIKEY_COMPOSE_H
#define TRAFIKEY_COMPOSE_H

#include "emq.h"

/* A row's flow fields, {parent, policy, children, parent_queue, flow} in the Lua (absent =
 * nil); mark is the row's `flow`: the add_flow call that wrote it (compose.lua flow_parent). */
typedef struct {
    emq_sv parent, policy, children, parent_queue, mark;
} emq_flow;

/* flow_parent(jk): reads the row; 1 and *f when the row is in a flow, else 0. */
int emq_flow_parent(emq *e, emq_sv jk, emq_flow *f);
/* flow_of(row): the same from a row fence read wide (EMQ_ROW_WIDE entries). */
int emq_flow_of(const emq_sv *row, emq_flow *f);
void emq_flow_child_done(emq *e, emq_sv id, const emq_flow *f, emq_sv result);
void emq_flow_child_dead(emq *e, emq_sv id, const emq_flow *f, emq_sv error_text);
/* flow_child_removed: a child leaves without a settle (cancel(remove=True) by its holder). */
void emq_flow_child_removed(emq *e, emq_sv id, const emq_flow *f);
void emq_flow_forget(emq *e, emq_sv jk);
/* end_cancelled: a lapsed job whose holder was asked to stop (the sweeps). */
void emq_end_cancelled(emq *e, emq_sv id, emq_sv jk, emq_sv g, emq_sv flag, emq_sv attempts,
                       long long now);

#endif
