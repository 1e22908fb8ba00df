"""Pure decision functions: observations in, decisions out. No I/O, no clock, no backends."""
