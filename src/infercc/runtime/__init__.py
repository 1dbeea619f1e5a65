"""Running built models: artifact directories, timing and `bench`, and the tuning cache."""
