"""glob(3) as glibc does it for ldconfig's include lines: fnmatch with FNM_PERIOD, one path
component at a time."""


def has_meta(text):
    return "*" in text or "?" in text or "[" in text


def _match_class(pattern, i, ch):
    """Match CH against the bracket expression at PATTERN[i] ('['); (matched, next index)
    or None when the bracket is not closed (then '[' is literal)."""
    j = i + 1
    negate = j < len(pattern) and pattern[j] in "!^"
    if negate:
        j += 1
    matched = False
    first = True
    while j < len(pattern) and (first or pattern[j] != "]"):
        first = False
        lo = pattern[j]
        if lo == "\\" and j + 1 < len(pattern):
            j += 1
            lo = pattern[j]
        if j + 2 < len(pattern) and pattern[j + 1] == "-" and pattern[j + 2] != "]":
            hi = pattern[j + 2]
            if lo <= ch <= hi:
                matched = True
            j += 3
        else:
            if ch == lo:
                matched = True
            j += 1
    if j >= len(pattern):
        return None
    return matched != negate, j + 1


def fnmatch(pattern, name):
    """fnmatch(3) with FNM_PERIOD semantics for one path component."""
    if name.startswith(".") and not pattern.startswith("."):
        return False
    if pattern.startswith("*") and not has_meta(pattern[1:]) and "\\" not in pattern:
        return name.endswith(pattern[1:])           # the common "*.conf"
    p = n = 0
    star_p = star_n = -1
    while n < len(name):
        if p < len(pattern):
            c = pattern[p]
            if c == "*":
                star_p, star_n = p, n
                p += 1
                continue
            if c == "?":
                p += 1
                n += 1
                continue
            if c == "[":
                res = _match_class(pattern, p, name[n])
                if res is not None:
                    if res[0]:
                        p = res[1]
                        n += 1
                        continue
                elif name[n] == "[":
                    p += 1
                    n += 1
                    continue
            else:
                if c == "\\" and p + 1 < len(pattern):
                    p += 1
                    c = pattern[p]
                if c == name[n]:
                    p += 1
                    n += 1
                    continue
        if star_p >= 0:
            p = star_p + 1
            star_n += 1
            n = star_n
            continue
        return False
    while p < len(pattern) and pattern[p] == "*":
        p += 1
    return p == len(pattern)


def join_path(directory, name):
    if directory == "":
        return name
    if directory.endswith("/"):
        return directory + name
    return directory + "/" + name
