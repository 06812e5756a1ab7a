"""What specbuild writes for a shell to run (results/serve.sh): every word quoted, every
environment name checked, every comment one line.

A config value written unquoted into a script runs as code when the script does (`make serve`):
an env name `X=1; touch f; Y` would. So a name must be a plain variable name (ENV_NAME, the
same pattern config/config.schema.yaml gives `sglang.env` and the `*api_key_env` keys), an
assignment is quoted whole, and text in a comment loses its line breaks (a newline would end
the comment and start a command).

Contract: `export_line(name, value)` is one `export` line, or ValueError for a name that is no
variable name; `comment_line(text)` is one `#` line; `is_env_name` says whether a name is one.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

__all__ = ["ENV_NAME", "comment_line", "export_line", "is_env_name"]

# An environment variable's name: letters, digits and underscores, not starting with a digit.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_env_name(name: Any) -> bool:
    """Whether `name` is a plain environment variable name."""
    return isinstance(name, str) and bool(ENV_NAME.fullmatch(name))


def export_line(name: str, value: Any) -> str:
    """`export NAME=value`, the assignment quoted as one word."""
    if not is_env_name(name):
        raise ValueError(
            f"environment variable name {name!r}: letters, digits and _ only, not starting "
            "with a digit"
        )
    return "export " + shlex.quote(f"{name}={value}")


def comment_line(text: str) -> str:
    """`# text` on one line, whatever line breaks `text` holds."""
    return "# " + " ".join(str(text).split())
