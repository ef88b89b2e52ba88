"""Running the workbook: the runner (the stage notebooks under papermill, in kept Jupyter kernels) and
sweeps of many runs on Ray."""
