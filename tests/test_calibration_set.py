"""The calibration bench's paraphrase rule (docs/vectors.md §2): a pair is a
paraphrase when no query term shares a stem with its answer, by the
snapshot's own FTS5 tokenizer. Checked on a real snapshot, since the rule is
only as good as its agreement with the index that lexical search uses."""

import pytest

from bench.calibration_eval import paraphrases


@pytest.mark.parametrize("query, answer, paraphrase", [
    ("list directory contents", "For each operand that names a file, ls shows its name.", True),
    ("list directory contents", "Lists the contents of each directory operand.", False),  # list/lists, contents
    ("Implements a Barrier", "Useful for synchronizing a fixed number of threads.", True),
    ("remove files", "Removing a file deletes its directory entry.", False),  # files/file, remove/removing
])
def test_a_pair_is_a_paraphrase_when_no_query_term_shares_a_stem_with_the_answer(api, query, answer, paraphrase):
    key = api.key()
    api.observe(key, content=answer, claim={"statement": answer, "kind": "semantic_fact", "confidence": 0.9})
    api.rebuild(key)
    snapshot = api.service.reader.current("acme")
    assert paraphrases(snapshot, [{"query": query, "answer": answer}]) == [paraphrase]
