"""The build library: options, the session (checks, lock, engine, verdict, commit), inputs, codec, planning,
the stages, the shard writer, publishing, and the engines."""
