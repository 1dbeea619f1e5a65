"""What goes into a model: input signatures, generated feeds, sample files, images, and the
`--shape` specs that pin symbolic dimensions."""
