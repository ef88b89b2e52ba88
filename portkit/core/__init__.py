"""portkit's foundations: errors, atomic files, findings and whose code they come from, the grading policy, what a
stage could not assess, tables, progress, availability probes, where portkit's files are, the module stack,
placement, parameter checks, and the one boundary to torch's private APIs. Nothing here imports another portkit
package."""
