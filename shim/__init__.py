"""gRPC layer of shardetcd: etcd's services over the shard store."""
