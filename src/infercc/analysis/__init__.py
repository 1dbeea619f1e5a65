"""What a model costs on a target: the target database, the roofline, memory planning and
model information (`inspect`)."""
