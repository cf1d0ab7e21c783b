#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown files (ctest `doc_links`).

For README.md, docs/**/*.md and every other Markdown file of the checkout (tracked, or
untracked and not ignored; never under build*/ or node_modules/), every inline link and image
and every link reference definition whose target is not an absolute URL (a scheme such as
http:, https:, mailto:) must name a file or directory that exists in the repository, relative
to the linking file (a target starting with `/` is relative to the repository root). A
`#fragment`, on its own or after a Markdown file, must be one of that file's heading anchors
under GitHub's rules: the heading's text lowercased, every character that is not a letter, a
digit, a space, a hyphen or an underscore dropped, spaces turned into hyphens, and the second
and later headings of one anchor suffixed -1, -2, ... Links inside code (fenced or indented
blocks, inline code spans) are not links and are skipped.

    scripts/check_doc_links.py [REPO_ROOT]

Prints `FILE:LINE: target: reason` for each broken link and a one-line summary; exits 1 when a
link is broken, 0 otherwise. Python 3 standard library only.
"""

import os
import re
import subprocess
import sys
import unicodedata
import urllib.parse

MARKDOWN_SUFFIXES = (".md", ".markdown")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
LIST_ITEM = re.compile(r"^( {0,3}(?:[-+*]|\d{1,9}[.)]))(?:( {1,4})(?=\S)|[ \t]*$)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[((?:[^\]\\]|\\.)+)\]:[ \t]*(<[^>]*>|\S+)")
HTML_TARGET = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*(?:\"([^\"]*)\"|'([^']*)')",
                         re.IGNORECASE)


def is_skipped_dir(name):
    return name == "node_modules" or name.startswith("build") or name.startswith(".")


def markdown_files(root):
    """Repository-relative paths of the Markdown files to check, sorted."""
    paths = set()
    try:
        listed = subprocess.run(
            ["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            check=True, capture_output=True).stdout.decode("utf-8").split("\0")
        paths.update(p for p in listed if p.lower().endswith(MARKDOWN_SUFFIXES))
    except (OSError, subprocess.CalledProcessError):
        for directory, subdirs, files in os.walk(root):
            subdirs[:] = [d for d in subdirs if not is_skipped_dir(d)]
            rel = os.path.relpath(directory, root)
            paths.update(os.path.normpath(os.path.join(rel, f)) for f in files
                         if f.lower().endswith(MARKDOWN_SUFFIXES))
    return sorted(p for p in paths
                  if os.path.isfile(os.path.join(root, p))
                  and not any(is_skipped_dir(part) for part in p.split("/")[:-1]))


def mask_code_blocks(lines):
    """The lines with fenced and indented code blocks blanked (line count kept), and for each
    line whether it is prose (outside a code block)."""
    out, prose = [], []
    fence = None          # the opening fence's character and length while inside a fenced block
    list_indent = None    # inside a list item: the column its content starts at
    previous_blank = True
    in_indented_code = False
    for line in lines:
        stripped = line.strip()
        if fence is not None:
            m = FENCE.match(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= fence[1] \
                    and not line[m.end():].strip():
                fence = None
            out.append("")
            prose.append(False)
            previous_blank = False
            continue
        indent = len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip(" "))
        code_indent = 4 + (list_indent or 0)
        m = FENCE.match(line)
        if m and indent < code_indent and not (m.group(1)[0] == "`" and "`" in line[m.end():]):
            fence = (m.group(1)[0], len(m.group(1)))
            out.append("")
            prose.append(False)
            previous_blank = False
            in_indented_code = False
            continue
        if stripped and indent >= code_indent and (in_indented_code or previous_blank):
            in_indented_code = True
            out.append("")
            prose.append(False)
            previous_blank = False
            continue
        if stripped:
            in_indented_code = False
            item = LIST_ITEM.match(line)
            if item:
                list_indent = len(item.group(1)) + len(item.group(2) or " ")
            elif previous_blank and list_indent is not None and indent < list_indent:
                list_indent = None
        out.append(line)
        prose.append(True)
        previous_blank = not stripped
    return out, prose


def mask_inline_code(text):
    """The text with every inline code span's content (and its backticks) turned into spaces."""
    result = list(text)
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] != "`":
            i += 1
            continue
        j = i
        while j < len(text) and text[j] == "`":
            j += 1
        run = j - i
        k = j
        close = -1
        while k < len(text):
            if text[k] == "`":
                e = k
                while e < len(text) and text[e] == "`":
                    e += 1
                if e - k == run:
                    close = e
                    break
                k = e
            else:
                k += 1
        if close < 0:
            i = j
            continue
        for p in range(i, close):
            if result[p] != "\n":
                result[p] = " "
        i = close
    return "".join(result)


def matching_bracket(text, start):
    """The index of the `]` closing the `[` at start, or -1 (not across a blank line)."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "\n" and text.startswith("\n", i + 1):
            return -1
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def link_destination(text, start):
    """The destination of the inline link whose `(` is at start, or None if it is no link."""
    i = start + 1
    while i < len(text) and text[i] in " \t\n":
        i += 1
    if i < len(text) and text[i] == "<":
        end = text.find(">", i)
        if end < 0 or "\n" in text[i:end]:
            return None
        dest, i = text[i + 1:end], end + 1
    else:
        depth, begin = 0, i
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c in " \t\n":
                break
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0:
                    break
                depth -= 1
            i += 1
        dest = text[begin:i]
    while i < len(text) and text[i] in " \t\n":
        i += 1
    if i < len(text) and text[i] in "\"'(":
        close = {"\"": "\"", "'": "'", "(": ")"}[text[i]]
        end = text.find(close, i + 1)
        if end < 0:
            return None
        i = end + 1
        while i < len(text) and text[i] in " \t\n":
            i += 1
    if i >= len(text) or text[i] != ")":
        return None
    return dest


def strip_inline_markup(text):
    """A heading's text as GitHub renders it: links and images as their text, code unquoted,
    HTML tags dropped."""
    text = re.sub(r"!?\[((?:[^\]\\]|\\.)*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "")


def github_slug(text):
    keep = []
    for c in strip_inline_markup(text).strip().lower():
        category = unicodedata.category(c)
        if c.isalnum() or c in " -_" or category.startswith("M") or category == "Pc":
            keep.append("-" if c == " " else c)
    return "".join(keep)


def heading_anchors(lines):
    """Every anchor the file's headings (and HTML name/id attributes) give, GitHub's way."""
    masked, prose = mask_code_blocks(lines)
    anchors, counts = set(), {}

    def add(slug):
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(slug if n == 0 else "%s-%d" % (slug, n))

    for i, line in enumerate(masked):
        if not prose[i]:
            continue
        for m in re.finditer(r"<[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", line):
            anchors.add(m.group(1))
        m = ATX_HEADING.match(line)
        if m:
            add(github_slug(re.sub(r"[ \t]+#+$", "", m.group(2) or "")))
            continue
        if (i > 0 and prose[i - 1] and masked[i - 1].strip() and SETEXT_UNDERLINE.match(line)
                and not ATX_HEADING.match(masked[i - 1]) and not LIST_ITEM.match(masked[i - 1])
                and "|" not in masked[i - 1]):
            add(github_slug(masked[i - 1]))
    return anchors


class Checker:
    def __init__(self, root):
        self.root = os.path.realpath(root)
        self.anchor_cache = {}
        self.broken = []
        self.links = 0
        self.absolute = 0

    def anchors_of(self, path):
        if path not in self.anchor_cache:
            with open(path, encoding="utf-8", errors="replace") as f:
                self.anchor_cache[path] = heading_anchors(f.read().split("\n"))
        return self.anchor_cache[path]

    def check_target(self, rel_file, line_no, target):
        self.links += 1
        target = target.strip()
        if SCHEME.match(target) or target.startswith("//"):
            self.links -= 1
            self.absolute += 1
            return
        path_part, _, fragment = target.partition("#")
        path_part = urllib.parse.unquote(path_part.split("?", 1)[0])
        fragment = urllib.parse.unquote(fragment)
        source = os.path.join(self.root, rel_file)
        if not path_part:
            if not target:
                self.report(rel_file, line_no, target, "empty link target")
                return
            resolved = source
        elif path_part.startswith("/"):
            resolved = os.path.normpath(os.path.join(self.root, path_part.lstrip("/")))
        else:
            resolved = os.path.normpath(os.path.join(os.path.dirname(source), path_part))
        real = os.path.realpath(resolved)
        if real != self.root and not real.startswith(self.root + os.sep):
            self.report(rel_file, line_no, target, "outside the repository")
            return
        if not os.path.exists(resolved):
            self.report(rel_file, line_no, target,
                        "no such file or directory (%s)" % os.path.relpath(resolved, self.root))
            return
        if "#" in target and os.path.isfile(resolved) \
                and resolved.lower().endswith(MARKDOWN_SUFFIXES):
            if fragment not in self.anchors_of(resolved):
                self.report(rel_file, line_no, target, "no heading with anchor #%s in %s"
                            % (fragment, os.path.relpath(resolved, self.root)))

    def report(self, rel_file, line_no, target, reason):
        self.broken.append((rel_file, line_no, "%s:%d: %s: %s" % (rel_file, line_no, target, reason)))

    def check_file(self, rel_file):
        with open(os.path.join(self.root, rel_file), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        masked, prose = mask_code_blocks(lines)
        for i, line in enumerate(masked):
            m = REFERENCE_DEFINITION.match(line) if prose[i] else None
            if m:
                self.check_target(rel_file, i + 1, m.group(2).strip("<>"))
                masked[i] = ""
        text = mask_inline_code("\n".join(masked))
        line_starts = [0]
        for i, c in enumerate(text):
            if c == "\n":
                line_starts.append(i + 1)

        def line_of(offset):
            lo, hi = 0, len(line_starts) - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if line_starts[mid] <= offset:
                    lo = mid
                else:
                    hi = mid - 1
            return lo + 1

        for start in (m.start() for m in re.finditer(r"\[", text)):
            if start > 0 and text[start - 1] == "\\":
                continue
            close = matching_bracket(text, start)
            if close < 0 or not text.startswith("(", close + 1):
                continue
            dest = link_destination(text, close + 1)
            if dest is not None:
                self.check_target(rel_file, line_of(close + 1), dest)
        for m in HTML_TARGET.finditer(text):
            self.check_target(rel_file, line_of(m.start()), m.group(1) or m.group(2) or "")


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print(__doc__.strip())
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(__file__), "..")
    checker = Checker(root)
    files = markdown_files(checker.root)
    for rel_file in files:
        checker.check_file(rel_file)
    for _, _, line in sorted(checker.broken):
        print(line)
    print("check_doc_links: %d files, %d links checked (%d absolute URLs skipped), %d broken"
          % (len(files), checker.links, checker.absolute, len(checker.broken)))
    return 1 if checker.broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
