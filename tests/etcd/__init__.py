"""Tests of the etcd groundwork (client layer, URLs, test servers) against real etcd."""
