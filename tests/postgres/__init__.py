"""Tests of the PostgreSQL groundwork: test servers, the SQL layer, URL parsing."""
