"""The one audited place that touches redis-py attributes outside its documented API.

echomq fences every new connection on the connection itself (the version fence, D1), and
that needs hooks redis-py does not document: the connect callback a pool hands to each
connection it makes, the connections a pool already holds, the cluster client's
connect callback and slot map. Every such access is a function here, and
``tests/client/test_connect.py`` asserts each attribute exists on real client objects, so a
redis-py release that moves one fails that test loudly instead of silently skipping the
fence.

The names used, by object:

- ``redis.ConnectionPool`` / ``redis.asyncio.ConnectionPool``: ``connection_kwargs``
  (with its ``redis_connect_func`` entry), ``_available_connections``,
  ``_in_use_connections``;
- a pool connection: ``redis_connect_func``;
- ``redis.asyncio.ConnectionPool``: ``connection_class`` and ``connection_kwargs`` (see
  :func:`pack_in_c`), and its connections' ``pack_command`` and ``send_packed_command``
  methods, ``_reader``, ``_writer``, ``health_check_interval`` and ``next_health_check``;
- ``redis.cluster.RedisCluster``: ``user_on_connect_func``, ``nodes_manager``;
- ``redis.asyncio.cluster.RedisCluster``: ``nodes_manager``; its ``ClusterNode``:
  ``connection_kwargs``, ``connection_class``;
- both cluster clients: ``commands_parser`` (its ``get_keys``, see
  :func:`route_module_commands`).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import hiredis

__all__ = [
    "CONNECT_HOOK",
    "POOL_ATTRIBUTES",
    "client_kwargs",
    "cluster_connect_hook",
    "connect_hook",
    "hook_targets",
    "node_pool_kwargs",
    "pack_in_c",
    "pool_connection",
    "refresh_slots",
    "route_module_commands",
    "set_cluster_connect_hook",
    "set_connect_hook",
]

# The keyword a pool passes to each connection it makes; the connection calls it in place
# of its own ``on_connect`` (the handshake), so a hook must run ``on_connect`` itself.
CONNECT_HOOK = "redis_connect_func"

# What tests/client/test_connect.py checks on a real pool (sync and asyncio).
POOL_ATTRIBUTES = ("connection_kwargs", "_available_connections", "_in_use_connections")


def client_kwargs(client: Any) -> dict[str, Any]:
    """The connection options a client's connections are made with (``{}`` if unknown)."""
    get = getattr(client, "get_connection_kwargs", None)
    if callable(get):
        kwargs = get()
    else:
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return kwargs if isinstance(kwargs, dict) else {}


def hook_targets(client: Any) -> list[Any]:
    """Where a standalone client's connect hook lives: its pool's connection kwargs (for the
    connections the pool will make) and every connection the pool already made."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return []
    conns = list(getattr(pool, "_available_connections", None) or [])
    conns += list(getattr(pool, "_in_use_connections", None) or [])
    return [pool.connection_kwargs, *conns]


def connect_hook(target: Any) -> Any:
    """The connect hook installed on a hook target (None when there is none)."""
    if isinstance(target, dict):
        return target.get(CONNECT_HOOK)
    return getattr(target, CONNECT_HOOK, None)


def set_connect_hook(target: Any, hook: Any) -> None:
    if isinstance(target, dict):
        target[CONNECT_HOOK] = hook
    else:
        setattr(target, CONNECT_HOOK, hook)


def cluster_connect_hook(client: Any) -> tuple[bool, Any]:
    """``(is_a_sync_cluster_client, its current user connect callback)``."""
    if not hasattr(client, "user_on_connect_func"):
        return False, None
    return True, client.user_on_connect_func


def set_cluster_connect_hook(client: Any, hook: Any) -> None:
    client.user_on_connect_func = hook


def refresh_slots(client: Any) -> Any:
    """Re-read a cluster's slot map (after an ASK/MOVED the client did not follow itself).
    Returns the awaitable on an asyncio client."""
    return client.nodes_manager.initialize()


def _module_keys(args: tuple[Any, ...]) -> list[Any] | None:
    """The keys of an ``EMQ.*`` command, which follows EVAL's convention (``EMQ.<VERB>
    numkeys key... arg...``); None for any other command."""
    name = args[0]
    text = name.decode("latin-1") if isinstance(name, (bytes, bytearray)) else str(name)
    if len(args) < 2 or text[:4].upper() != "EMQ.":
        return None
    return list(args[2 : 2 + int(args[1])])


def _sync_get_keys(self: Any, redis_conn: Any, *args: Any) -> Any:
    keys = _module_keys(args)
    return keys if keys is not None else self._echomq_get_keys(redis_conn, *args)


async def _async_get_keys(self: Any, *args: Any) -> Any:
    keys = _module_keys(args)
    return keys if keys is not None else await self._echomq_get_keys(*args)


# A key-routing subclass per parser class (sync, asyncio), made once.
_ROUTING: dict[type, type] = {}


def route_module_commands(client: Any) -> None:
    """Route a cluster client's ``EMQ.*`` commands by their key positions, as redis-py
    routes EVAL: the parser (shared by the client and its pipelines) otherwise asks
    ``COMMAND GETKEYS`` of the client's default node for every call of a module command,
    and redis-py never replaces that node when it dies, so every EMQ.* call would fail
    once it did, on every queue (and a default node without the module cannot answer).
    The parser's class becomes a subclass whose ``get_keys`` reads the keys locally."""
    parser = getattr(client, "commands_parser", None)
    if parser is None:
        return
    base = type(parser)
    if base in _ROUTING.values():
        return
    cls = _ROUTING.get(base)
    if cls is None:
        asynchronous = inspect.iscoroutinefunction(base.get_keys)
        namespace = {
            "__slots__": (),
            "get_keys": _async_get_keys if asynchronous else _sync_get_keys,
            "_echomq_get_keys": base.get_keys,
        }
        cls = _ROUTING[base] = type(base.__name__, (base,), namespace)
    parser.__class__ = cls


def node_pool_kwargs(node: Any) -> tuple[Any, dict[str, Any]]:
    """``(connection_class, kwargs)`` to build a plain pool for an asyncio cluster node,
    without the cluster's own connect hook."""
    kwargs = dict(node.connection_kwargs)
    kwargs.pop(CONNECT_HOOK, None)
    return node.connection_class, kwargs


def pool_connection(pool: Any) -> Any:
    """A connected connection from a sync pool, counted as in use until released. redis-py
    before 5.3 requires a command name argument; later releases deprecate passing one."""
    param = inspect.signature(pool.get_connection).parameters.get("command_name")
    if param is not None and param.default is inspect.Parameter.empty:
        return pool.get_connection("PING")
    return pool.get_connection()


def _pack_in_c(self: Any, *args: Any) -> list[bytes]:
    """An asyncio connection's ``pack_command``, packed by hiredis in C: what redis-py's sync
    connections already do when hiredis is installed (its ``HiredisRespSerializer``, whose
    argument handling this follows), where the asyncio ones run a Python packer that costs
    the worker about a tenth of its CPU per job (a settle call carries ~100 arguments)."""
    first = args[0]
    if isinstance(first, str):
        args = tuple(first.encode().split()) + args[1:]
    elif b" " in first:
        args = tuple(first.split()) + args[1:]
    try:
        return [hiredis.pack_command(args)]
    except TypeError:  # a memoryview, a bool, None...: redis-py's own packer and its errors
        return list(self._python_pack(*args))


async def _send_without_a_task(self: Any, command: Any, check_health: bool = True) -> None:
    """An asyncio connection's ``send_packed_command`` that does not wrap every write in
    ``asyncio.wait_for``, which on Python 3.11 makes a task per command: with its wake-ups,
    three of the eight event-loop turns a worker spent per job at concurrency 1. A write the
    socket takes whole leaves nothing to wait for. Anything else (a write left in the
    buffer, a connection closing or failed, a health check due, a first connect) goes
    through redis-py's own path, with its timeout and its errors; a buffered write as an
    empty one that only drains."""
    writer = getattr(self, "_writer", None)
    reader = getattr(self, "_reader", None)
    if (
        type(command) is not list
        or writer is None
        or reader is None
        or (
            check_health
            and self.health_check_interval
            and asyncio.get_running_loop().time() > self.next_health_check
        )
        or writer.transport.is_closing()
        or reader.exception() is not None
    ):
        await self._wait_for_send(command, check_health)
        return
    writer.writelines(command)
    if writer.transport.get_write_buffer_size() or writer.transport.is_closing():
        await self._wait_for_send([], False)


# A C-packing subclass per asyncio connection class (TCP, TLS, unix socket), made once; it
# keeps the packer it replaces as ``_python_pack`` and the sender as ``_wait_for_send``.
_C_PACKING: dict[type, type] = {}


def pack_in_c(pool: Any) -> None:
    """Make the connections an asyncio pool will open pack commands with hiredis and send
    them without a task each: the pool's ``connection_class`` becomes a subclass whose
    ``pack_command`` is C and whose ``send_packed_command`` is :func:`_send_without_a_task`."""
    base = pool.connection_class
    encoding = str(pool.connection_kwargs.get("encoding", "utf-8")).lower().replace("-", "")
    if base in _C_PACKING.values() or encoding != "utf8":  # hiredis encodes str as UTF-8 only
        return
    cls = _C_PACKING.get(base)
    if cls is None:
        namespace = {
            "pack_command": _pack_in_c,
            "_python_pack": base.pack_command,
            "send_packed_command": _send_without_a_task,
            "_wait_for_send": base.send_packed_command,
        }
        cls = _C_PACKING[base] = type(base.__name__, (base,), namespace)
    pool.connection_class = cls
