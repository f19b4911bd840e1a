"""The training corpus of tools/train/train_mla.py: Debian's English text (fortunes and package
descriptions), ASCII documents of at least 20 characters, shuffled with the seed. Training takes
the first documents up to --corpus-bytes (2% of them held out for validation); every document
after the cut was never trained on (tools/train/mtp_acceptance.py reads those)."""

import glob
import os
import random
import subprocess

def fortunes():
    """Every fortune in /usr/share/games/fortunes (the plain-text files, '%'-separated)."""
    out = []
    for f in sorted(glob.glob("/usr/share/games/fortunes/**/*", recursive=True)):
        if os.path.isdir(f) or f.endswith((".dat", ".u8")) or os.path.islink(f):
            continue
        # Offensive fortunes are ROT13 in off/; leave them out.
        if "/off/" in f:
            continue
        try:
            text = open(f, encoding="latin-1").read()
        except OSError:
            continue
        for piece in text.split("\n%\n"):
            piece = piece.strip("%\n ")
            if piece:
                out.append(piece)
    return out


def package_descriptions():
    """'name: synopsis' and the long description of every package apt knows."""
    text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, errors="replace").stdout
    out, seen = [], set()
    for stanza in text.split("\n\n"):
        name, desc, lines = None, None, []
        in_desc = False
        for line in stanza.split("\n"):
            if line.startswith("Package: "):
                name = line[9:].strip()
                in_desc = False
            elif line.startswith("Description: "):
                desc = line[13:].strip()
                in_desc = True
            elif in_desc and line.startswith(" "):
                s = line[1:]
                lines.append("" if s.strip() == "." else s.rstrip())
            else:
                in_desc = False
        if not name or not desc or name in seen:
            continue
        seen.add(name)
        body = "\n".join(lines).strip()
        out.append(f"{name}: {desc}" + (f"\n{body}" if body else ""))
    return out


def build_corpus(max_bytes, seed):
    out, n = [], 0
    for d in shuffled_documents(seed):
        if n + len(d) > max_bytes:
            break
        out.append(d)
        n += len(d) + 1
    return out


def shuffled_documents(seed):
    """Every document, in the order build_corpus cuts them from."""
    docs = fortunes() + package_descriptions()
    docs = [d for d in docs if d.isascii() and len(d) >= 20]
    random.Random(seed).shuffle(docs)
    return docs


if __name__ == "__main__":
    # The held-out validation documents as one text file (what `mla bench --text` reads):
    #   /usr/bin/python3 tools/train/corpus.py /tmp/heldout.txt
    import sys

    docs = build_corpus(4000000, 1)
    held_out = docs[: max(1, len(docs) // 50)]
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(held_out))
    print(f"{len(held_out)} held-out documents of {len(docs)}, {sum(map(len, held_out))} bytes -> {sys.argv[1]}")
