"""Reading an input's bytes, beneath the sources: files (local and FileSystems), http(s) downloads,
NumPy .npz/.npy files."""
