"""The subcommands of ``pagedllm``. Each module has NAME, HELP, a docstring (its --help text),
add_arguments(parser) and run(args) -> exit code; heavy imports happen inside run()."""
