"""``python -m pagedllm``: the same as the ``pagedllm`` command."""

import sys

try:
    from pagedllm.cli import main
except KeyboardInterrupt:  # Ctrl-C at once: the same one line as later
    print("pagedllm: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
