"""The seams of the mutation check (tests/model/mutations.py): what each re-introduces
(``SEAMS``), its built-in patches of the fixed code in Lua and in the native C twin
(``PATCHES``, exact-text edits whose anchors test_model_scenarios.py checks are in the
tree), and the test files beyond tests/model/ that must catch it too (``EXTRA``).
"""

from __future__ import annotations

SEAMS: dict[str, str] = {
    "base": "no mutation (the baseline)",
    "1": "a flow child counted twice (ignored death, reprocess, completion)",
    "4": "the cancel flag outlives its run",
    "5": "a re-admitted/reprocessed id reads its previous result",
    "remove-flows": "a child's settle writes orphan keys of a removed parent",
    "reap-dedup": "a debounce hands its payload to a reaped, still-leased holder",
    # Issue 37's fixes (FINDINGS "Mutation check for issue 37").
    "resend-row": "a nonce-less resend answers replayed for another call's row",
    "occurrence-bit": "minted ids leave bit 21 clear (a repeat's occurrence space)",
    "fold-ttl": "a debounce fold keeps the holder's ttl",
    "fold-lane": "a debounce fold drops the new call's lane without a word",
    "limit-wake": "a settle under a queue-wide limit wakes no parked claimer",
    "moved": "the dashboard's remove/cancel act on a job that moved since the page",
    "marker-ttl": "replay-marker TTL bookkeeping per queue name, not per Keys",
    "retired-ttl": "a held-back retired generation takes no TTL",
    "retired-bytesum": "the retired record's size check by the id's last byte",
    "handback-floor": "the shutdown hand-back is a delay 0 (spends an attempt)",
    "progress-kept": "a reprocess keeps the previous run's progress (issue 38's verbs)",
    "reassign-priority": "a reassigned waiting job loses its priority (issue 38's verbs)",
    "shard-lane": "a sharded queue routes a lane's job by its id, not its lane (issue 43)",
}

# seam -> [(file, the fixed code's exact text, the mutant's)]: each undoes the line of the
# fix that matters, in Lua and in the native twin.
PATCHES: dict[str, list[tuple[str, str, str]]] = {
    "1": [
        (
            "src/echomq/lua/include/compose.lua",
            "  if before == 'processed' or before == 'unsuccessful' then return end\n",
            "",
        ),
        ("native/compose.c", "    if (before == 0 || before == 1) return;\n", ""),
    ],
    "4": [
        (
            "src/echomq/lua/include/fence.lua",
            "local function release(base, id, jk, row)\n"
            "  rcall('HDEL', jk, 'lease_epoch', 'cancel')",
            "local function release(base, id, jk, row)\n  rcall('HDEL', jk, 'lease_epoch')",
        ),
        (
            "native/fence.c",
            '    emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"), EMQ_LIT("cancel"));\n'
            '    if (emq_eqs(row[1], "active")) return emq_leave_active(e, id, row[2]);',
            '    emq_call(e, "HDEL", 2, jk, EMQ_LIT("lease_epoch"));\n'
            '    if (emq_eqs(row[1], "active")) return emq_leave_active(e, id, row[2]);',
        ),
    ],
    "5": [
        (
            "src/echomq/lua/reprocess.lua",
            "rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id)\n",
            "",
        ),
        (
            "src/echomq/lua/include/admit.lua",
            "  if not fresh then rcall('DEL', base .. 'result:' .. id, base .. 'notify:' .. id)"
            " end\n",
            "",
        ),
        (
            "native/cmd_reprocess.c",
            "    emq_del(e, 2, emq_key2(e, EMQ_KP_RESULT, id), emq_key2(e, EMQ_KP_NOTIFY, id));\n",
            "",
        ),
        (
            "native/admit.c",
            "    if (!fresh) emq_del(e, 2, emq_key2(e, EMQ_KP_RESULT, id),"
            " emq_key2(e, EMQ_KP_NOTIFY, id));\n",
            "",
        ),
    ],
    "remove-flows": [
        (
            "src/echomq/lua/include/compose.lua",
            "  if not flow_parent_row(pk, mark) then return end\n"
            "  local before = flow_recorded(pk, id)",
            "  local before = flow_recorded(pk, id)",
        ),
        (
            "native/compose.c",
            "    if (!flow_parent_row(e, pk, mark)) return;\n"
            "    int before = flow_recorded(e, pk, id);",
            # (void): the build has -Werror, and mark is then unused.
            "    (void)mark;\n    int before = flow_recorded(e, pk, id);",
        ),
    ],
    "reap-dedup": [
        (
            "src/echomq/lua/include/control.lua",
            "  if row[3] then rcall('HDEL', jk, 'lease_epoch', 'cancel') end\n",
            "",
        ),
        (
            "native/control.c",
            '    if (row[2].p) emq_call(e, "HDEL", 3, jk, EMQ_LIT("lease_epoch"),'
            ' EMQ_LIT("cancel"));\n',
            "",
        ),
    ],
    # ---- issue 37 (fixes after f1c54ba) ----
    "resend-row": [  # 6474132: replayed only when the row holds this call's payload
        (
            "src/echomq/lua/enqueue.lua",
            "    if rcall('TYPE', jk).ok == 'hash'"
            " and rcall('HGET', jk, 'payload') == ARGV[3] then\n",
            "    if true then\n",
        ),
        (
            "native/cmd_enqueue.c",
            "            landed = emq_hmget(e, jk, 1, fields, held) && held[0].p"
            " && emq_eq(held[0], payload);\n",
            "            (void)fields;\n            (void)held;\n            landed = 1;\n",
        ),
    ],
    "occurrence-bit": [  # 6474132: Python only (the client mints)
        (
            "src/echomq/ids.py",
            "    return (ms << 22) | MINTED_BIT | (node << _SEQ_BITS) | seq\n",
            "    return (ms << 22) | (node << _SEQ_BITS) | seq\n",
        ),
    ],
    "fold-ttl": [  # d069e9e: the fold writes the new call's expires (or drops the holder's)
        (
            "src/echomq/lua/include/control.lua",
            "  if expires then\n"
            "    rcall('HSET', jk, 'expires', expires)\n"
            "  elseif row[5] then\n"
            "    rcall('HDEL', jk, 'expires')\n"
            "  end\n",
            "",
        ),
        (
            "native/control.c",
            "    if (expires.p)\n"
            '        emq_hset(e, 3, jk, EMQ_LIT("expires"), expires);\n'
            "    else if (row[4].p)\n"
            '        emq_call(e, "HDEL", 2, jk, EMQ_LIT("expires"));\n',
            "    (void)expires;\n",
        ),
    ],
    "fold-lane": [  # d069e9e: a call for another lane than the waiting holder's is refused
        (
            "src/echomq/lua/include/control.lua",
            "  if (row[2] or '') ~= (g or '') then return nil, holder, row[2] or '' end\n",
            "",
        ),
        (
            "native/control.c",
            '    if (!emq_eq(had, g.p ? g : EMQ_LIT(""))) {\n'
            "        *lane_out = had;\n"
            "        return holder;\n"
            "    }\n",
            "    (void)had;\n    (void)g;\n",
        ),
    ],
    "limit-wake": [  # d069e9e: a wake token per freed slot still open while work waits
        (
            "src/echomq/lua/settle.lua",
            "    if room > 0 and rcall('SCARD', base .. 'inring') > 0 then"
            " wake(base, math.min(freed, room)) end\n",
            "",
        ),
        (
            "native/cmd_settle.c",
            "                    emq_wake(e, freed < room ? freed : room);\n",
            "                    (void)room;\n",
        ),
    ],
    "moved": [  # 882a9c8: Lua only (remove and cancel have no native twin)
        (
            "src/echomq/lua/include/control.lua",
            "  if not seen or seen == '' then return false end\n",
            "  do return false end\n",
        ),
    ],
    # f8a8794: the old bookkeeping, one per queue name. Since issue 37 the scripts also time
    # a marker key found without a TTL (mark_one's PTTL read, in Lua and C), which repairs
    # the client's mistake on its own: alone, the client's patch is an equivalent mutant, so
    # the server's repair is undone with it (both halves of the fix regress together).
    "marker-ttl": [
        (
            "src/echomq/protocol/kernel.py",
            "        self.marker_ttls: dict[int, tuple[int, set[str]]] = {}\n",
            "        self.marker_ttls = _MARKER_TTLS.setdefault(self.base, {})\n",
        ),
        (
            "src/echomq/protocol/kernel.py",
            "\nclass Keys:\n",
            "\n_MARKER_TTLS: dict = {}\n\n\nclass Keys:\n",
        ),
        (
            "src/echomq/lua/include/admit.lua",
            "  if ttl or rcall('PTTL', key) == -1 then "
            "rcall('PEXPIRE', key, replay_ms + 2000) end\n",
            "  if ttl then rcall('PEXPIRE', key, replay_ms + 2000) end\n",
        ),
        (
            "native/admit.c",
            '    if (ttl || emq_int(e, emq_call(e, "PTTL", 1, key)) == -1)\n',
            "    if (ttl)\n",
        ),
    ],
    "retired-ttl": [  # 2e6bfda: the held-back generation's PEXPIRE
        ("src/echomq/lua/include/common.lua", "      rcall('PEXPIRE', rk, 2 * ID_REPLAY_MS)\n", ""),
        (
            "native/common.c",
            '            emq_call(e, "PEXPIRE", 2, rk, emq_fmt_ll(e, 2 * EMQ_ID_REPLAY_MS));\n',
            "",
        ),
    ],
    "retired-bytesum": [  # 2724257: the first id's byte sum, not its last byte
        (
            "src/echomq/lua/include/common.lua",
            "    for i = 1, #id do sum = sum + string.byte(id, i) end\n",
            "    sum = string.byte(id, -1)\n",
        ),
        (
            "native/common.c",
            "        for (size_t i = 0; i < pairs[0].n; i++)"
            " sum += (unsigned char)pairs[0].p[i];\n",
            "        sum = (unsigned char)pairs[0].p[pairs[0].n - 1];\n",
        ),
    ],
    "handback-floor": [  # 73a8645: Python only (the worker's verb)
        (
            "src/echomq/runtime/queueloop.py",
            "        calls = [_ctl.push_back(self.keys, r.job.id, r.job.token, 0) for r in left]\n",
            "        calls = [_p.delay(self.keys, r.job.id, r.job.token, 0) for r in left]\n",
        ),
    ],
    "progress-kept": [  # issue 38: update_progress's field, which a reprocess clears
        (
            "src/echomq/lua/reprocess.lua",
            "'cancel', 'progress', 'finished_ms'",
            "'cancel', 'finished_ms'",
        ),
        (
            "native/cmd_reprocess.c",
            'emq_call(e, "HDEL", 8, jk, EMQ_LIT("last_error"), EMQ_LIT("stalled"),'
            ' EMQ_LIT("cancel"),\n             EMQ_LIT("progress"), ',
            'emq_call(e, "HDEL", 7, jk, EMQ_LIT("last_error"), EMQ_LIT("stalled"),'
            ' EMQ_LIT("cancel"),\n             ',
        ),
    ],
    "reassign-priority": [  # issue 38: reassign is Lua on both executors (no C twin)
        (
            "src/echomq/lua/reassign.lua",
            "rcall('ZADD', waiting_key(base, dst), row[3] or 0, id)",
            "rcall('ZADD', waiting_key(base, dst), 0, id)",
        ),
    ],
    "shard-lane": [  # issue 43: Python only (the sharded client routes), both twins
        (
            "src/echomq/client/async_sharded.py",
            "        key, minter = opts.group or opts.dedup or opts.id, self._x.minter\n",
            "        key, minter = opts.dedup or opts.id, self._x.minter\n",
        ),
        (
            "src/echomq/client/sync_sharded.py",
            "        key, minter = opts.group or opts.dedup or opts.id, self._x.minter\n",
            "        key, minter = opts.dedup or opts.id, self._x.minter\n",
        ),
    ],
}

# seam -> the test files beyond tests/model/ that must catch it too (the fix's own tests):
# run with the model directory, and their failures reported per file.
EXTRA: dict[str, list[str]] = {
    "resend-row": ["tests/protocol/test_fleet_ids.py"],
    "occurrence-bit": ["tests/protocol/test_fleet_ids.py"],
    "fold-ttl": ["tests/protocol/test_seams_37.py"],
    "fold-lane": ["tests/protocol/test_seams_37.py"],
    "limit-wake": ["tests/protocol/test_seams_37.py"],
    "moved": ["tests/ops/test_dashboard_moved.py"],
    "marker-ttl": ["tests/protocol/test_memory_bounds.py"],
    "retired-ttl": ["tests/protocol/test_memory_bounds.py"],
    "retired-bytesum": ["tests/protocol/test_memory_bounds.py"],
    "handback-floor": ["tests/runtime/test_handback.py"],
}
