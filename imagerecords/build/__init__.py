"""The builder: inputs, codec, planning, the stages, the shard writer, publishing, and the engines."""
