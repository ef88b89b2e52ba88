"""The run folder: which stage writes which file (layout), stage results and their typed readers, and the
environment block every result is stamped with."""
