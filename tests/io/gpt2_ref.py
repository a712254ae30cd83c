"""gpt2_ref.py - an independent GPT-2 byte-level BPE, in plain Python, for weft's tests.

weft's tokenizer (worker/io/tokenizer.c) pre-tokenizes with PCRE2 and merges with a
rank-cached pair scan. This module shares none of that: the pre-tokenizer is GPT-2's
pattern worked out by hand from unicodedata categories, and the merge loop is the one of
OpenAI's encoder.py (lowest-ranked bigram, every occurrence replaced left to right). It
also trains a small BPE on a corpus, so tests need no downloaded vocabulary, and writes it
as GPT-2's vocab.json + merges.txt and as a Hugging Face tokenizer.json.

Used as a script (the C tests call it):
    gpt2_ref.py fixtures DIR      write DIR/{vocab.json, merges.txt, tokenizer.json,
                                  tokenizer_pairs.json, expected.json}
    gpt2_ref.py encode DIR FILE   print the ids of FILE's text as JSON (vocab.json in DIR)
"""
import base64
import collections
import json
import os
import sys
import unicodedata

EOT = "<|endoftext|>"
# Unicode's White_Space property: what \s means in Python's regex module (GPT-2's).
WHITE_SPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | {
    chr(c) for c in range(0x2000, 0x200B)}


def bytes_to_unicode():
    """encoder.py's table: byte -> a printable character."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) +
          list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_ENC = bytes_to_unicode()
BYTE_DEC = {v: k for k, v in BYTE_ENC.items()}


def is_l(c):
    return unicodedata.category(c).startswith("L")


def is_n(c):
    return unicodedata.category(c).startswith("N")


def is_ws(c):
    return c in WHITE_SPACE


def _run(text, i, pred):
    j = i
    while j < len(text) and pred(text[j]):
        j += 1
    return j


def pretokenize(text):
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+,
    alternative by alternative, as a backtracking matcher would try them."""
    out, i, n = [], 0, len(text)
    other = lambda c: not (is_ws(c) or is_l(c) or is_n(c))
    while i < n:
        j = None
        if text[i] == "'":
            for c in ("s", "t", "re", "ve", "m", "ll", "d"):
                if text.startswith(c, i + 1):
                    j = i + 1 + len(c)
                    break
        for pred in (is_l, is_n, other):
            if j is not None:
                break
            k = i + 1 if text[i] == " " and i + 1 < n and pred(text[i + 1]) else i
            if k < n and pred(text[k]):
                j = _run(text, k, pred)
        if j is None:  # whitespace: \s+(?!\S), else \s+
            end = _run(text, i, is_ws)
            j = end if end == n or end - i == 1 else end - 1
        out.append(text[i:j])
        i = j
    return out


def get_pairs(word):
    return set(zip(word, word[1:]))


class Ref:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.ranks = {tuple(m): r for r, m in enumerate(merges)}

    def bpe(self, token):
        """encoder.py's merge loop."""
        word = tuple(token)
        pairs = get_pairs(word)
        while pairs:
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            first, second = bigram
            new, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new.extend(word[i:])
                    break
                new.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new.append(first + second)
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = tuple(new)
            pairs = get_pairs(word)
        return word

    def encode(self, text):
        ids = []
        pieces = text.split(EOT)
        for k, piece in enumerate(pieces):
            for tok in pretokenize(piece):
                mapped = "".join(BYTE_ENC[b] for b in tok.encode("utf-8"))
                ids.extend(self.vocab[t] for t in self.bpe(mapped))
            if k + 1 < len(pieces):
                ids.append(self.vocab[EOT])
        return ids

    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        return b"".join(inv[i].encode() if inv[i] == EOT else bytes(BYTE_DEC[c] for c in inv[i])
                        for i in ids)


def train(corpus, n_merges):
    """A byte-level BPE: the most frequent pair (ties: the smallest) merged n times."""
    words = collections.Counter(
        tuple(BYTE_ENC[b] for b in t.encode("utf-8")) for t in pretokenize(corpus))
    order = [BYTE_ENC[b] for b in sorted(BYTE_ENC, key=lambda b: ord(BYTE_ENC[b]))]
    vocab = {s: i for i, s in enumerate(order)}
    merges = []
    for _ in range(n_merges):
        counts = collections.Counter()
        for w, c in words.items():
            for p in zip(w, w[1:]):
                counts[p] += c
        if not counts:
            break
        best = max(counts.items(), key=lambda kv: (kv[1], [-ord(ch) for ch in kv[0][0] + kv[0][1]]))[0]
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        new_words = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += c
        words = new_words
    vocab[EOT] = len(vocab)
    return vocab, merges


CORPUS = """The quick brown fox jumps over the lazy dog. It's the dog's day; they'll see, we've
been there, I'm sure you'd agree. Numbers: 12345, 3.14159, 2024-05-20, 1,000,000!
    Indented   lines\twith\ttabs   and trailing spaces   
Ünïcödé wörds: café, naïve, façade, Straße; Ελληνικά, русский текст, 中文字符, 日本語の文.
Emoji 🙂🚀 and symbols ©®™ — “quotes” ‘single’ «guillemets» … ellipsis.
def f(x):
    return x ** 2 + 1  # code, with (parens) [brackets] {braces} <angles>
"""

TEXTS = [
    "Hello world",
    "It's a dog's life; they'll say we've won, I'm sure you'd agree, 'tis 'S",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand   \n  mixed \t whitespace",
    "numbers 1234567890 and 3.14 and ٣٤٥ and ½ ⅔",
    "Ünïcödé café naïve Straße Ελληνικά русский 中文字符 日本語の文",
    "emoji 🙂🚀🙂 symbols ©®™ — “quotes” …",
    "no\u00a0break\u2003em\u3000ideographic\u2028line\u0085nel\x1cfs",
    "first document<|endoftext|>second document<|endoftext|><|endoftext|>third",
    "<|endoftext|>",
    "",
    "def f(x):\n    return x ** 2 + 1  # code\n",
    "'''quotes''' and 'apostrophes' and '' and ' s",
    "x" * 300 + " " + "ab" * 150,
]


def write_fixtures(d):
    vocab, merges = train(CORPUS, 400)
    with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    for name, ms in (("tokenizer.json", [f"{a} {b}" for a, b in merges]),
                     ("tokenizer_pairs.json", [[a, b] for a, b in merges])):
        hf = {"version": "1.0", "truncation": None, "padding": None,
              "added_tokens": [{"id": vocab[EOT], "content": EOT, "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": True,
                                "special": True}],
              "normalizer": None,
              "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                                "trim_offsets": True, "use_regex": True},
              "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                                 "trim_offsets": False, "use_regex": True},
              "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                          "use_regex": True},
              "model": {"type": "BPE", "dropout": None, "unk_token": None,
                        "continuing_subword_prefix": "", "end_of_word_suffix": "",
                        "fuse_unk": False, "byte_fallback": False,
                        "vocab": {k: v for k, v in vocab.items() if k != EOT}, "merges": ms}}
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            json.dump(hf, f, ensure_ascii=False)
    ref = Ref(vocab, merges)
    cases = []
    for t in TEXTS + [CORPUS]:
        ids = ref.encode(t)
        assert ref.decode(ids) == t.encode("utf-8")
        cases.append({"text": base64.b64encode(t.encode("utf-8")).decode(), "ids": ids,
                      "pretokens": len(pretokenize(t))})
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"vocab": len(vocab), "merges": len(merges), "eot": vocab[EOT],
                   "cases": cases}, f)


def load(d):
    with open(os.path.join(d, "vocab.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(d, "merges.txt"), encoding="utf-8") as f:
        merges = [tuple(l.rstrip("\n").split(" ")) for l in f if l.strip() and not l.startswith("#version")]
    return Ref(vocab, merges)


if __name__ == "__main__":
    if sys.argv[1] == "fixtures":
        write_fixtures(sys.argv[2])
    elif sys.argv[1] == "encode":
        with open(sys.argv[3], encoding="utf-8") as f:
            print(json.dumps(load(sys.argv[2]).encode(f.read())))
