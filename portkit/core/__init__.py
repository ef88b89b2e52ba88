"""portkit's foundations: errors, atomic files, findings and whose code they come from, tables, progress,
availability probes, the module stack, placement, parameter checks, and the one boundary to torch's private APIs.
Nothing here imports another portkit package."""
