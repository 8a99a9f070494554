"""Generated gRPC stubs of proto/minedraft/v1 (generation_pb2, generation_pb2_grpc, ...).

The stubs are build outputs, not sources: `pip install` writes them (setup.py), and
`bin/_venv.sh` re-runs the generator when a .proto is newer than the install. Importing
this package does nothing else (no protoc at import time).
"""
