"""Soak and hostile-client runs against the real server (``smso-serve`` on loopback).

The runs themselves live beside their tests: :mod:`tests.soak.short_soak` (mixed requests,
SIGTERM midway), :mod:`tests.soak.long_soak` (everything at once for minutes),
:mod:`tests.soak.grpc_flood` (gRPC messages the server must refuse, HTTP/2 rapid reset), and the
requests they send, :mod:`tests.soak.hostile`. Their quick versions run in every ``make test``;
the full ones are marked ``soak`` and run only with ``make soak`` (``pytest tests/soak -m
soak``), each printing its tables and writing its JSON record (see :mod:`tests.soak.conftest`).
"""
