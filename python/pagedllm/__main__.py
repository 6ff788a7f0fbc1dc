"""``python -m pagedllm``: the same as the ``pagedllm`` command."""

import sys

from pagedllm.cli import main

sys.exit(main())
