"""The `hexstudio` command line. Each command group lives in its own module with a
`register(subparsers)` function; COMMAND_MODULES lists them."""
