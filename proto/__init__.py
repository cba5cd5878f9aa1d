"""The etcd v3 wire contract (etcd 3.5 compatible) and its generated Python code.

``kv.proto`` (package ``mvccpb``), ``auth.proto`` (``authpb``) and ``rpc.proto``
(``etcdserverpb``) are the sources of truth. The ``*_pb2.py``, ``*_pb2.pyi`` and
``rpc_pb2_grpc.py`` modules next to them are generated and committed; rebuild
them with ``python -m proto.generate`` and verify them with
``python -m proto.generate --check``.
"""
