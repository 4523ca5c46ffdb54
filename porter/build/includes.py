"""Which files a template's source may make the compiler read: only the project's own headers.

The check runs on what the preprocessor sees, not on the text: trigraphs (`??=`) and line
splices (backslash-newline) are undone, comments become spaces (string and character literals
kept intact, so a `/*` inside a string starts nothing), and a directive is a line whose first
token is `#` or its digraph `%:`. Every `include`, `include_next`, `import` and `embed` directive
must then name one of the allowed headers literally, in quotes or angle brackets; a computed
include (`#include SOME_MACRO`) is refused, since what a macro expands to is decided later.
"""
from __future__ import annotations

import re
from typing import Iterable

READS_A_FILE = ("include", "include_next", "import", "embed")
_DIRECTIVE = re.compile(r"[ \t\f\v]*(?:#|%:)[ \t\f\v]*([A-Za-z_]\w*)(.*)")
_HEADER = re.compile(r'[ \t\f\v]*(?:"([^"\n]*)"|<([^>\n]*)>)[ \t\f\v]*')


def phases(source: str) -> str:
    """The source after translation phases 1-3 as far as directives are concerned: trigraphs
    and line splices undone, each comment replaced by one space."""
    text = source.replace("\r\n", "\n").replace("??=", "#").replace("??/", "\\")
    text = re.sub(r"\\[ \t]*\n", "", text)
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            # a comment keeps its line breaks, so directives stay on their lines
            out.append(" " + "\n" * text.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        elif c == "R" and text.startswith('R"', i) and (m := re.match(r'R"([^ ()\\\n]{0,16})\(',
                                                                       text[i:])):
            end = text.find(")" + m.group(1) + '"', i + m.end())
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append('R""')         # its lines are not lines of the source
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def file_directives(source: str) -> list[tuple[str, str]]:
    """(directive, rest of its line) for each directive that reads a file."""
    found = []
    for line in phases(source).split("\n"):
        m = _DIRECTIVE.match(line)
        if m and m.group(1) in READS_A_FILE:
            found.append((m.group(1), m.group(2).strip()))
    return found


def forbidden_include(source: str, allowed: Iterable[str]) -> str | None:
    """The first directive that could read a file outside `allowed` (header names relative to
    the include folder), as written after the preprocessor's first phases; None if all are
    allowed."""
    allowed = set(allowed)
    for directive, arg in file_directives(source):
        m = _HEADER.fullmatch(arg)
        name = m and (m.group(1) if m.group(1) is not None else m.group(2))
        if directive != "include" or not name or name not in allowed:
            return f"#{directive} {arg}".strip()
    return None
