"""The `pangea.v1` protobuf modules, generated at build time from the repository's
`proto/pangea/v1` (see setup.py): `client_pb2`, `data_pb2`, `ad_profile_pb2`."""
