"""The avatar: a photo registered for the Ditto engine (detection, crop, the source
features, the cache on disk) and the paste-back of rendered crops into it."""
