"""Fixtures: real redis-server processes started and stopped by the tests themselves.

The session server runs on a free port in a temp dir (``ECHOMQ_TEST_URL`` points the suite
at another server instead). Each test gets a unique queue name, never a FLUSHALL, and a
SCRIPT FLUSH so the NOSCRIPT -> EVAL path runs all the time.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis
import redis.asyncio

import echomq
from echomq.client import native as _native
from echomq.protocol.scripts import SCRIPTS
from echomq.server import EmbeddedServer

# procs.py holds the subprocess helpers and the `spawn` fixture every process test uses;
# pytester runs a user's test file against echomq's own pytest plugin (test_testing_helpers).
pytest_plugins = ["procs", "pytester"]

_counter = itertools.count()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer | None]:
    if os.environ.get("ECHOMQ_TEST_URL"):
        yield None
        return
    srv = EmbeddedServer(tmp_path_factory.mktemp("redis"), appendonly=False).start()
    expect_server_kind(srv)
    _session_servers.append(srv)
    yield srv
    srv.stop()


# Servers this session started (never one it was pointed at): emptied after each module.
_session_servers: list[EmbeddedServer] = []


@pytest.fixture(autouse=True, scope="module")
def _empty_session_servers_after_module() -> Iterator[None]:
    """Every test names its queues uniquely, so a finished module's keys are never read
    again; but check() and the raw checkers SCAN the whole keyspace, and session servers
    that kept every module's keys (~48k by the end of a run) made those tests minutes
    slower. Each module starts from servers that hold only its own keys."""
    yield
    for srv in _session_servers:
        with contextlib.suppress(redis.ConnectionError), redis.Redis.from_url(srv.url) as c:
            c.flushall()


@pytest.fixture(autouse=True)
def _fresh_minters() -> None:
    """Each test's queues lease a mint node of their own (ids.minter_for, issue 37): a lease
    renewal (one node_lease call 20 s into a lease) never lands in another test's counted
    calls, and the FLUSHALL between modules never leaves a minter on a node the server
    forgot."""
    echomq.ids._minters.clear()


def expect_server_kind(srv: EmbeddedServer) -> None:
    """ECHOMQ_TEST_SERVER_NAME (set by test_valkey's nested run) is the INFO `server_name`
    the session's servers must report, so a run meant for Valkey cannot pass on Redis."""
    want = os.environ.get("ECHOMQ_TEST_SERVER_NAME")
    if want:
        with redis.Redis.from_url(srv.url) as c:
            got = c.info("server").get("server_name", "redis")
        assert got == want, f"{srv.url} is {got!r}, not {want!r}"


@pytest.fixture(scope="session")
def session_url(server: EmbeddedServer | None) -> str:
    return os.environ.get("ECHOMQ_TEST_URL") or (server.url if server else "")


# --------------------------------------------------------------------------- both executors
# A test module with `pytestmark = pytest.mark.executors` runs each test that reaches a server
# (through `url`/`redis_url`) twice: [lua] on the session server, [native] on one session
# server that loads trafikey, with `?executor=native` in `url` and ECHOMQ_EXECUTOR=native (so
# a Queue built from a raw client is native too). `@pytest.mark.executors("lua")` on one test
# keeps it on the Lua leg only (a test about EVAL/EVALSHA itself).

LEGS = ("lua", "native")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "executors(*legs): run the test on the lua and native executors"
    )
    _isolate_from_the_users_home()


# Tests marked slow here rather than in their files (so the list is one place to read and
# to tune): the ones that took half a second or more in a `scripts/check --fast` run (real
# processes, outages, clusters, chaos, randomized and stateful runs, whole examples).
# `scripts/check --fast` deselects them with the rest of `slow`; CI (plain scripts/check)
# runs them all.
SLOW_TESTS = frozenset(
    {
        "tests/repo/test_bench_smoke.py::test_bench_smoke",
        "tests/repo/test_docs_run.py::test_document_runs",
        "tests/repo/test_check_script.py::test_every_test_listed_slow_in_conftest_exists",
        "tests/repo/test_check_script.py::test_no_test_that_needs_chromium_or_valgrind_runs_under_fast",
        "tests/ops/test_cli.py::test_subprocess_check_violation_exits_1",
        "tests/ops/test_cli.py::test_subprocess_enqueue_stats_check",
        "tests/ops/test_cli.py::test_subprocess_unreachable_server",
        "tests/ops/test_cli_mistakes.py::test_an_app_that_raises_on_import_shows_its_traceback",
        "tests/ops/test_cli_mistakes.py::test_bad_log_level_is_one_line",
        "tests/ops/test_cli_mistakes.py::test_cli_names_the_unreachable_server",
        "tests/ops/test_cli_mistakes.py::test_job_shows_enqueued_attempts_and_errors",
        "tests/ops/test_cli_mistakes.py::test_lanes_list_and_set",
        "tests/ops/test_cli_mistakes.py::test_lanes_set_create",
        "tests/ops/test_cli_mistakes.py::test_operator_commands_on_a_missing_queue_exit_1",
        "tests/ops/test_cli_mistakes.py::test_pause_create_skips_the_check",
        "tests/ops/test_cli_mistakes.py::test_producer_gives_up_with_server_unreachable",
        "tests/ops/test_cli_mistakes.py::test_remove_reports_each_id",
        "tests/ops/test_cli_mistakes.py::test_stats_fits_80_columns_without_cutting_names",
        "tests/ops/test_cli_mistakes.py::test_url_without_a_scheme_is_one_line",
        "tests/cluster/test_cluster.py::test_cli_on_a_cluster_url",
        "tests/cluster/test_cluster.py::test_cross_queue_flow_across_shards",
        "tests/cluster/test_cluster.py::test_queues_spread_over_every_primary",
        "tests/cluster/test_cluster.py::test_worker_serves_queues_on_different_shards",
        "tests/client/test_connect.py::test_app_no_longer_imports_the_process_manager",
        "tests/client/test_connect.py::test_cluster_attributes_exist_on_real_clients",
        "tests/features/test_results_dedup_cancel.py::test_200_async_waiters_on_one_queue",
        "tests/features/test_queue_rate_limit.py::test_rate_limit_ttl_zero_means_a_claim_is_served",
        "tests/features/test_queue_rate_limit.py::test_rate_limit_under_four_claimers_never_exceeds_its_window",
        "tests/features/test_queue_rate_limit.py::test_spent_lane_leaves_the_ring_and_comes_back",
        "tests/features/test_controls_under_a_worker.py::test_cancel_reaches_a_running_job_before_its_next_heartbeat",
        "tests/features/test_controls_under_a_worker.py::test_task_rate_limit_applies_to_its_queue",
        "tests/reliability/test_crash.py::test_server_sigkill_mid_run",
        "tests/reliability/test_crash.py::test_worker_started_before_the_server_waits_for_it",
        "tests/ops/test_examples.py::test_controls_example",
        "tests/ops/test_examples.py::test_flow_example",
        "tests/ops/test_examples.py::test_periodic_example",
        "tests/ops/test_examples.py::test_quickstart_example",
        "tests/client/test_executor_faults.py::test_a_settle_after_the_servers_idle_timeout_reconnects_first",
        "tests/client/test_executor_faults.py::test_async_settles_after_the_servers_idle_timeout",
        "tests/client/test_executor_faults.py::test_durability_error_carries_what_a_claim_and_a_settle_applied",
        "tests/native/test_executors_topology.py::test_aof_restart_of_a_module_server_keeps_the_keyspace",
        "tests/native/test_executors_topology.py::test_cluster_refuses_emq_calls_as_it_refuses_eval",
        "tests/native/test_executors.py::test_module_server_sigkill_mid_run",
        "tests/native/test_executors_topology.py::test_native_on_the_cluster_with_a_failover",
        "tests/native/test_executors.py::test_one_queue_through_both_executors",
        "tests/native/test_executors_topology.py::test_replica_without_the_module_ends_identical",
        "tests/native/test_executors_topology.py::test_run_through_a_cutting_proxy_on_native",
        "tests/native/test_executors.py::test_worker_sigkill_chaos_on_native",
        "tests/features/test_fairness.py::test_flat_set_and_lane_share_the_rotation",
        "tests/protocol/test_script_regressions.py::test_check_on_a_live_queue_reports_no_torn_transition",
        "tests/protocol/test_script_regressions_ids.py::test_enqueue_many_with_an_id_twice_far_apart",
        "tests/protocol/test_script_regressions_ids.py::test_the_retired_record_keeps_two_generations",
        "tests/protocol/test_hostile.py::test_every_verb_under_hostile_arguments",
        "tests/protocol/test_hostile_worker.py::test_malformed_rows_never_crash_a_worker",
        "tests/runtime/test_hung_handlers.py::test_an_isolated_handler_returns_its_value",
        "tests/runtime/test_hung_handlers.py::test_an_isolated_handler_that_hangs_is_killed",
        "tests/runtime/test_hung_handlers.py::test_the_stranded_cap_stops_claiming_until_a_thread_returns",
        "tests/runtime/test_hung_handlers.py::test_timed_out_sync_handlers_free_their_slots_and_are_counted",
        "tests/protocol/test_ids_keyspace.py::test_mint_monotonic_over_100k",
        "tests/native/test_native_claim.py::test_big_batch_chunks_the_active_zadd",
        "tests/native/test_native_claim.py::test_lane_rate_limits",
        "tests/native/test_native_claim.py::test_randomized",
        "tests/native/test_native_conformance_fuzz.py::test_fuzz",
        "tests/native/test_native_conformance_fuzz.py::test_mutation_fuzz",
        "tests/native/test_native_conformance_fuzz.py::test_randomized",
        "tests/client/test_native_select.py::test_cluster_native_only_when_every_primary_has_it",
        "tests/client/test_native_select.py::test_module_build_prints_a_loadable_line",
        "tests/client/test_native_select.py::test_server_native_builds_and_loads",
        "tests/native/test_native_settle.py::test_randomized",
        "tests/native/test_native_settle_flows.py::test_sweep_ring_order_is_the_order_first_met",
        "tests/native/test_native_settle_cmd.py::test_big_batches",
        "tests/native/test_native_settle_cmd.py::test_mixed_settles",
        "tests/native/test_native_settle_cmd_fuzz.py::test_randomized",
        "tests/native/test_native_settle_cmd.py::test_worker_loop",
        "tests/features/test_observe.py::test_events_and_metrics_on_a_cluster",
        "tests/features/test_prometheus.py::test_echomq_metrics_command_serves_the_exposition",
        "tests/features/test_prometheus.py::test_multiprocess_mode",
        "tests/reliability/test_proxy.py::test_add_log_with_a_lost_reply_raises_instead_of_writing_twice",
        "tests/reliability/test_proxy.py::test_enqueue_with_lost_replies_makes_one_job_per_call",
        "tests/reliability/test_proxy.py::test_run_through_a_cutting_proxy",
        "tests/upgrade/test_rolling_upgrade.py::test_rolling_upgrade",
        "tests/features/test_rate_limit_procs.py::test_rate_limit_holds_under_four_worker_processes",
        "tests/features/test_repeat_cron.py::test_four_processes_fire_each_occurrence_exactly_once",
        "tests/features/test_repeat.py::test_periodic_task_registers_runs_and_drops_stale",
        "tests/ops/test_security.py::test_no_code_path_unpickles_or_evaluates_payloads",
        "tests/ops/test_security.py::test_tls_end_to_end",
        "tests/ops/test_security.py::test_worker_and_producer_under_the_acl_user",
        "tests/ops/test_server_demo.py::test_demo_runs_on_lua_when_the_built_module_will_not_load",
        "tests/ops/test_server_demo.py::test_no_server_binary_is_one_line",
        "tests/ops/test_server_demo.py::test_no_server_binary_with_a_built_module_is_one_line",
        "tests/ops/test_server_demo.py::test_server_dies_with_its_owner",
        "tests/ops/test_server_demo.py::test_server_records_itself_and_stops_clean",
        "tests/ops/test_server_demo.py::test_stop_outlasts_a_refused_sigterm",
        "tests/ops/test_server_demo.py::test_the_readme_demo_command_runs",
        "tests/ops/test_server_demo.py::test_worker_without_url_runs_its_own_server",
        "tests/reliability/test_server_restart.py::test_a_recorded_server_that_is_gone_fails_every_client",
        "tests/reliability/test_server_restart.py::test_a_second_server_is_refused_and_the_first_keeps_its_state",
        "tests/reliability/test_server_restart.py::test_a_second_server_on_the_same_data_dir_is_refused",
        "tests/reliability/test_server_restart.py::test_a_taken_port_is_reported_on_restart",
        "tests/reliability/test_server_restart.py::test_a_worker_replaces_the_record_of_its_own_dead_server",
        "tests/reliability/test_server_restart.py::test_quick_start_survives_a_server_restart",
        "tests/reliability/test_server_restart.py::test_verbose_names_the_server_and_its_source",
        "tests/features/test_testing_helpers.py::test_drain_times_out_on_a_paused_queue",
        "tests/features/test_testing_helpers.py::test_plugin_in_a_real_pytest_subprocess",
        "tests/runtime/test_worker.py::test_broken_backoff_policy_does_not_strand_the_job",
        "tests/runtime/test_worker.py::test_concurrency_caps_jobs_in_flight",
        "tests/runtime/test_worker.py::test_exponential_backoff_spaces_attempts",
        "tests/runtime/test_worker.py::test_fixed_backoff_spaces_attempts",
        "tests/runtime/test_worker.py::test_sync_timeout_does_not_charge_jobs_that_never_ran",
        "tests/runtime/test_worker.py::test_task_timeout_fails_the_run_and_retries",
        "tests/runtime/test_worker_faults.py::test_durable_worker_runs_what_it_claimed_while_no_replica_acks",
        "tests/runtime/test_worker_faults.py::test_reclaimed_job_keeps_its_heartbeat",
        "tests/runtime/test_worker_faults.py::test_worker_rides_out_a_busy_window",
        "tests/runtime/test_worker_faults.py::test_worker_rides_out_an_oom_refusal",
        "tests/runtime/test_worker_logs.py::test_an_outage_warns_once_per_kind_and_says_when_it_reconnected",
        "tests/runtime/test_worker_logs.py::test_json_lines_carry_the_fields",
        "tests/runtime/test_worker_logs.py::test_text_lines_name_queue_job_task_attempt",
        "tests/runtime/test_worker_logs.py::test_worker_refuses_an_unknown_log_format",
        "tests/runtime/test_worker_metrics.py::test_worker_metrics_port_serves_the_workers_series",
        "tests/runtime/test_worker_procs.py::test_frozen_worker_is_fenced_out",
        "tests/runtime/test_worker_procs.py::test_idle_worker_is_quiet",
        "tests/runtime/test_worker_procs.py::test_long_job_with_heartbeats_is_delivered_once",
        "tests/runtime/test_worker_procs.py::test_second_sigterm_exits_immediately",
        "tests/runtime/test_worker_procs.py::test_sigkilled_worker_jobs_run_elsewhere_once",
        "tests/runtime/test_worker_procs.py::test_sigterm_lets_in_flight_jobs_finish_within_grace",
        "tests/runtime/test_worker_procs.py::test_sigterm_past_grace_hands_jobs_back_at_once",
        "tests/runtime/test_worker_procs.py::test_thousand_jobs_through_two_worker_processes",
        "tests/protocol/test_memory_bounds.py::test_after_a_burst_only_owned_keys_stay_and_within_their_bounds",
        "tests/protocol/test_memory_bounds.py::test_a_burst_s_retired_record_is_gone_after_a_quiet_spell",
        "tests/protocol/test_check_memory.py::test_a_grown_retired_generation_without_a_ttl",
    }
)


# The pytest-xdist worker this process is ("gw0", ...), or "" when the suite runs in one
# process. scripts/check runs the suite on several workers, one test file per worker at a
# time (--dist loadfile), so a file's module-scoped servers are started once.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("[", 1)[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
    if _XDIST_WORKER:
        _order_files_for_xdist(items)


def _order_files_for_xdist(items: list[pytest.Item]) -> None:
    """The order xdist hands out files in (scripts/check passes --no-loadscope-reorder, so
    this one holds): test_valkey's nested run (~100 s, mostly waiting on its servers) first,
    so the worker that draws it starts it at once and the others run the suite beside it;
    then the files with the most tests, so the last ones handed out are short. Each file's
    tests keep their order, and every worker orders alike, as xdist requires."""
    files = [item.nodeid.split("::", 1)[0] for item in items]
    count: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, f in enumerate(files):
        count[f] = count.get(f, 0) + 1
        first.setdefault(f, i)
    rank = {id(item): i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[bool, int, int, int]:
        f = item.nodeid.split("::", 1)[0]
        return (f != "tests/native/test_valkey.py", -count[f], first[f], rank[id(item)])

    items.sort(key=key)


_saved_env: dict[str, str] | None = None
_private_home: str | None = None


def _isolate_from_the_users_home() -> None:
    """The whole session, and every process it starts, runs with a HOME, XDG_CACHE_HOME and
    ECHOMQ_HOME of its own and none of the user's ECHOMQ_* settings (ECHOMQ_TEST_* and
    ECHOMQ_MODEL_* stay: they steer the suite; so does ECHOMQ_SERVER_BIN, the binary the
    suite's servers run, which test_valkey's nested run sets): a module the user built into
    ~/.cache/echomq, a server recorded in ./.echomq, an ECHOMQ_URL or ECHOMQ_EXECUTOR in the
    shell can never change what a test sees. Set at configure time, before any fixture or
    test reads them."""
    global _saved_env, _private_home
    if _saved_env is not None:
        return
    import tempfile

    _saved_env = dict(os.environ)
    _private_home = tempfile.mkdtemp(prefix="echomq-test-home-")
    for key in [k for k in os.environ if k.startswith("ECHOMQ_")]:  # the user's: dropped
        if not key.startswith(("ECHOMQ_TEST_", "ECHOMQ_MODEL_")) and key != "ECHOMQ_SERVER_BIN":
            del os.environ[key]
    os.environ["HOME"] = os.path.join(_private_home, "home")
    os.environ["XDG_CACHE_HOME"] = os.path.join(_private_home, "cache")
    os.environ["ECHOMQ_HOME"] = os.path.join(_private_home, "state")
    # A test that unsets ECHOMQ_HOME walks up from its tmp_path looking for .echomq/: never
    # into the temp dir itself or above, where another run's state may lie.
    os.environ["ECHOMQ_CEILING_DIRS"] = tempfile.gettempdir()
    os.makedirs(os.environ["HOME"])


def pytest_unconfigure(config: pytest.Config) -> None:
    global _saved_env, _private_home
    if _saved_env is None:
        return
    import shutil

    os.environ.clear()
    os.environ.update(_saved_env)
    _saved_env = None
    if _private_home is not None:
        shutil.rmtree(_private_home, ignore_errors=True)
        _private_home = None


@pytest.fixture(autouse=True, scope="session")
def _valkey_run_beside_the_suite(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Start test_valkey's nested run at the session's first test when it is selected: it
    then runs beside the rest of the suite instead of after it (test_valkey.Nested says why
    that is safe). A run the test never waited for is stopped at the session's end."""
    import test_valkey

    # Under pytest-xdist every worker collects every test, but only one runs the nested
    # test: there the test starts the run itself, and it comes first (see below).
    selected = any(item.nodeid == test_valkey.NESTED_NODE for item in request.session.items)
    if selected and not _XDIST_WORKER:
        test_valkey.start_nested(tmp_path_factory.mktemp("valkey-nested"))
    yield
    test_valkey.stop_nested()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("executors")
    if marker is None or not {"url", "redis_url"} & set(metafunc.fixturenames):
        return  # a test that never reaches a server has nothing to compare
    legs = [leg for leg in LEGS if leg in (marker.args or LEGS)]
    metafunc.parametrize("executor", legs, indirect=True, ids=legs)


@pytest.fixture(scope="session")
def module_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """trafikey.so built once a session by make -C on a copy of native/ (the tree another
    helper may be editing is never written to, and a rebuild there cannot change the file a
    running server mapped). A failed build is an error of every test using it, never a skip."""
    return _native.build(tmp_path_factory.mktemp("trafikey"))


@pytest.fixture(scope="session")
def module_server(
    tmp_path_factory: pytest.TempPathFactory, module_so: Path
) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(
        tmp_path_factory.mktemp("redis-native"),
        appendonly=False,
        args=["--loadmodule", str(module_so)],
    ).start()
    expect_server_kind(srv)
    _session_servers.append(srv)
    yield srv
    srv.stop()


@pytest.fixture
def executor(request: pytest.FixtureRequest) -> str | None:
    """The leg of an `executors`-marked test; None for every other test."""
    return cast("str | None", getattr(request, "param", None))


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, executor: str | None, session_url: str) -> str:
    """The leg's server, with no echomq option (for raw redis clients)."""
    if executor != "native":
        return session_url
    srv: EmbeddedServer = request.getfixturevalue("module_server")
    return srv.url


@pytest.fixture
def url(executor: str | None, redis_url: str) -> str:
    return redis_url + "?executor=native" if executor == "native" else redis_url


@pytest.fixture(autouse=True)
def _executor_leg(request: pytest.FixtureRequest) -> Iterator[None]:
    """Pins ECHOMQ_EXECUTOR to the leg, and on the native leg proves no twin ran as Lua.

    The check: SCRIPT FLUSH before the test, and after it SCRIPT EXISTS of every script that
    has a native twin (_native.TWINS) must be all false. EVALSHA -> NOSCRIPT -> EVAL is the
    only way a script runs from the Lua executor, and EVAL caches the script, so a twin that
    went as Lua on this leg leaves its sha behind. Two round trips a test; it cannot be
    fooled by a queue's reported `executor`, and it follows TWINS as twins are added."""
    leg = getattr(getattr(request.node, "callspec", None), "params", {}).get("executor")
    if leg is None:
        yield
        return
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("ECHOMQ_EXECUTOR", leg)
    if leg != "native":
        yield
        return
    client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    shas = {name: SCRIPTS[name].sha for name in sorted(_native.TWINS)}
    try:
        client.script_flush()
        yield
        cached = client.script_exists(*shas.values())
        ran_as_lua = [name for name, hit in zip(shas, cached, strict=True) if hit]
        assert not ran_as_lua, f"on the native leg these twins ran as Lua scripts: {ran_as_lua}"
    finally:
        client.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    """A raw client for asserting wire state (bytes replies)."""
    client = redis.Redis.from_url(redis_url)
    client.script_flush()
    yield client
    client.close()


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"t{next(_counter)}-{os.getpid()}-{name}"


@pytest.fixture
def q(url: str, qname: str, r: redis.Redis) -> Iterator[echomq.Queue]:
    queue = echomq.Queue(qname, url=url)
    yield queue
    queue.close()


@pytest.fixture
async def aq(url: str, qname: str, r: redis.Redis) -> AsyncIterator[echomq.AsyncQueue]:
    queue = echomq.AsyncQueue(qname, url=url)
    yield queue
    await queue.aclose()


@pytest.fixture(params=["sync", "async"])
def anyq(request: pytest.FixtureRequest, url: str, qname: str, r: redis.Redis) -> Iterator[Any]:
    """The same test on Queue and on AsyncQueue (driven through a small sync adapter)."""
    if request.param == "sync":
        queue = echomq.Queue(qname, url=url)
        yield queue
        queue.close()
    else:
        adapter = SyncOverAsync(echomq.AsyncQueue(qname, url=url))
        yield adapter
        adapter.close()


class SyncOverAsync:
    """Runs every AsyncQueue verb to completion on a private loop, so one test body covers
    both classes. Only used by tests."""

    def __init__(self, aq: echomq.AsyncQueue) -> None:
        import asyncio

        self._aq = aq
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._aq, name)
        if not callable(attr):
            return attr

        def run(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(attr(*args, **kwargs))

        return run

    def close(self) -> None:
        self._loop.run_until_complete(self._aq.aclose())
        self._loop.close()


def wait_for(pred: Callable[[], Any], timeout: float = 60.0, interval: float = 0.02) -> Any:
    """Poll ``pred`` until it returns a truthy value; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def blocked_clients(r: redis.Redis, command: str = "blpop") -> int:
    """Connections of r's server blocked in ``command`` now (CLIENT LIST): a test waits on
    this for "the waiter is blocked" rather than sleeping and hoping it got there."""
    return sum(1 for c in r.client_list() if c.get("cmd") == command and "b" in c.get("flags", ""))


def command_calls(r: redis.Redis, command: str) -> int:
    """Calls of ``command`` r's server has run (INFO commandstats): "it never blocked" is
    asserted as no new BLPOP, not as a short elapsed time (issue 36)."""
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@contextlib.contextmanager
def running(worker: echomq.Worker) -> Iterator[echomq.Worker]:
    """``worker`` running in a thread of its own (its own event loop) for the block; stopped
    and joined after it, whatever the block raised."""
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.arun(),))
    thread.start()
    try:
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(60)
        loop.close()


def snapshot(r: redis.Redis, queue: str) -> dict[bytes, Any]:
    """Every key of the queue with its type and full content (for 'nothing written' tests)."""
    out: dict[bytes, Any] = {}
    for key in sorted(r.scan_iter(match=f"emq:{{{queue}}}:*", count=1000)):
        kind = r.type(key)
        if kind == b"hash":
            out[key] = ("hash", r.hgetall(key))
        elif kind == b"zset":
            out[key] = ("zset", r.zrange(key, 0, -1, withscores=True))
        elif kind == b"list":
            out[key] = ("list", r.lrange(key, 0, -1))
        elif kind == b"set":
            out[key] = ("set", r.smembers(key))
        else:
            out[key] = (kind, r.dump(key))
    return out


def server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def tmp_server(path: Path, **kw: Any) -> EmbeddedServer:
    return EmbeddedServer(path, **kw).start()
