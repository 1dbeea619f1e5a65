"""Running built models: artifact directories, the `Backend` protocol and the registry that
finds backends by name, timing and `bench`, and the tuning cache."""
