"""Tests of the ZooKeeper backend against real servers."""
