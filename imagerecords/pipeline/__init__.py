"""The build library: the settings and the session (checks, lock, engine, verdict, commit) here; the
inputs in sources/ and read/, then plan/, encode/, write/ (one shard's files), publish/ and engines/."""
