#!/usr/bin/env python3
"""Writes sacrebleu's scores for remat's BLEU test into tests/golden/bleu/sacrebleu.json.

sacrebleu comes from PyPI (not Debian): python3 -m venv DIR && DIR/bin/pip install sacrebleu,
then  DIR/bin/python tools/reference/gen_bleu_golden.py . The cases are fixed text (no
randomness), so the file is reproducible; it records the sacrebleu version that made it.
tests/test_bleu.cpp reads it: the 13a tokenization of every line must be equal, and every
corpus score within 0.01 (the issue's bound; remat matches to rounding).
"""
import json
import os
import sys

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "golden", "bleu", "sacrebleu.json")

# Lines that exercise each rule of the 13a tokenizer: symbols, periods and commas beside
# digits or not, a dash after a digit, HTML entities, <skipped>, Unicode letters and spaces.
TOKENIZE = [
    "Hello, world.",
    "Version 3.14, or 2,5 - see 1-2 (pages 10-12).",
    "ungültiges Argument für %qs: %<-fno-%s%>",
    "a.b,c 1.a a.1 1,b b,1 ..., ,,, 3-4-5 x-y",
    "&quot;quoted&quot; &amp; &lt;tag&gt; &foo;",
    "<skipped> dropped, line-\nbreak and\nnewline",
    "tabs\tand  spaces \u00a0NBSP\u2009thin\u3000ideographic",
    "{braces} [brackets] `tick` ~tilde @at #hash $dollar %pct ^caret |pipe \\back",
    "Größe überschritten: »%s« – „Anführung“ …",
    "",
    "   ",
    "end with space   ",
]

CORPORA = {
    "translations": (
        [
            "Die Datei %s kann nicht geöffnet werden",
            "ungültiges Argument für %qs",
            "Warnung: %s wird ignoriert.",
            "zu viele Argumente für Funktion",
            "Speicher erschöpft",
            "%qD ist kein Template",
            "Option -fPIC wird nicht unterstützt.",
            "Syntaxfehler in Zeile 12, Spalte 4",
        ],
        [
            "Datei %s kann nicht geöffnet werden",
            "ungültiges Argument für %qs",
            "Warnung: %s ignoriert.",
            "zu viele Argumente für die Funktion",
            "virtueller Speicher erschöpft",
            "%qD ist keine Vorlage",
            "Die Option -fPIC wird nicht unterstützt.",
            "Syntaxfehler in Zeile 12, Spalte 4",
        ],
    ),
    # Hypotheses shorter than the references: the brevity penalty.
    "short": (["die Datei", "Argument", "zu viele"], ["die Datei kann nicht", "ungültiges Argument hier", "zu viele Argumente"]),
    # No 3- or 4-gram matches: the exponential smoothing.
    "smoothing": (["a b c d", "e f g h i"], ["a b x c d", "e f y g h i"]),
    # Too short for any 4-gram: totals of 0 stop the precisions.
    "no_4grams": (["a b c", "d e"], ["a b c", "d e"]),
    # Nothing matches: 0.
    "no_match": (["x y z"], ["a b c"]),
    # An empty hypothesis among others.
    "empty_hyp": (["", "the cat sat on the mat"], ["a dog", "the cat sat on the mat"]),
    # Repeated words: clipped counts.
    "clipping": (["the the the the the the the"], ["the cat is on the mat"]),
    # Identical: 100.
    "identical": (["Speicher erschöpft", "zu viele Argumente für Funktion %qs"],
                  ["Speicher erschöpft", "zu viele Argumente für Funktion %qs"]),
}


def main():
    tok = Tokenizer13a()
    out = {
        "sacrebleu": sacrebleu.__version__,
        "tokenize_13a": [{"line": line, "tokens": tok(line.rstrip())} for line in TOKENIZE],
        "corpora": [],
    }
    bleu = sacrebleu.BLEU()  # the defaults: 13a, mixed case, exp smoothing
    for name, (hyps, refs) in CORPORA.items():
        b = bleu.corpus_score(hyps, [refs])
        out["corpora"].append({
            "name": name, "hypotheses": hyps, "references": refs, "score": b.score,
            "counts": b.counts, "totals": b.totals, "bp": b.bp, "sys_len": b.sys_len, "ref_len": b.ref_len,
        })
    out["signature"] = str(bleu.get_signature())
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(out['tokenize_13a'])} lines, {len(out['corpora'])} corpora (sacrebleu {sacrebleu.__version__})")


if __name__ == "__main__":
    sys.exit(main())
