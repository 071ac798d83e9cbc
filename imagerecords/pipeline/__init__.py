"""The build's stages, lowest first: the ground floor (errors, naming, storage, refs, urls, lock,
staging), then read/, encode/, config, plan/, sources/ and write/, publish/. The lifecycle that runs
them is builder/, above transforms/."""
