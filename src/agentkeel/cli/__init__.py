"""The `keel` command."""
