"""Coreference readers on bad files: encodings, a BOM, huge fields, limits, contradictory GAP rows."""

import pytest

from interp.data.coref import read_corefud, read_gap

HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"
TEXT = "Hobhouse studied with Bernard Leach from 1949 to 1952. His simple pottery is influenced by Leach."


def row(i=1, text=TEXT, pron=("His", 55), a=("Hobhouse", 0), b=("Bernard Leach", 22), a_c="TRUE", b_c="FALSE"):
    return "\t".join([f"dev-{i}", text, pron[0], str(pron[1]), a[0], str(a[1]), a_c, b[0], str(b[1]), b_c, "http://x"])


def gap_file(tmp_path, *rows, prefix=b""):
    path = tmp_path / "gap.tsv"
    path.write_bytes(prefix + "\n".join([HEADER, *rows]).encode() + b"\n")
    return path


CONLLU = ("# newdoc id = d1\n# sent_id = 1\n# text = Byron left .\n"
          "1\tByron\tByron\tPROPN\t_\t_\t2\tnsubj\t_\tEntity=(e1-person-1)\n"
          "2\tleft\tleave\tVERB\t_\t_\t0\troot\t_\t_\n3\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_\n\n")


def corefud_file(tmp_path, text=CONLLU, n_docs=2, prefix=b""):
    path = tmp_path / "c.conllu"
    path.write_bytes(prefix + "".join(text.replace("d1", f"d{i}") for i in range(n_docs)).encode())
    return path


def test_gap_non_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "gap.tsv"
    path.write_bytes((HEADER + "\n" + row(1) + "\n").encode() + row(2).encode().replace(b"Hobhouse", b"Hobh\xe9use", 1))
    with pytest.raises(ValueError, match=f"{path}:3: not UTF-8"):
        list(read_gap(path))


def test_corefud_non_utf8_names_file_and_line(tmp_path):
    path = corefud_file(tmp_path)
    path.write_bytes(path.read_bytes().replace(b"left", b"l\xffft", 1))
    with pytest.raises(ValueError, match=f"{path}:3: not UTF-8"):
        list(read_corefud(path))


def test_gap_field_over_the_csv_limit_names_file_and_line(tmp_path):
    big = "x" * (200 * 1024)
    path = gap_file(tmp_path, row(1), row(2, text=TEXT + " " + big))
    with pytest.raises(ValueError, match=f"{path}:3: unreadable GAP row.*field larger than field limit"):
        list(read_gap(path))


def test_gap_and_corefud_with_a_byte_order_mark_read_normally(tmp_path):
    (ex,) = read_gap(gap_file(tmp_path, row(1), prefix=b"\xef\xbb\xbf"))
    assert ex.id == "dev-1" and ex.label == "A"
    docs = list(read_corefud(corefud_file(tmp_path, prefix=b"\xef\xbb\xbf")))
    assert [d.doc_id for d in docs] == ["d0", "d1"]


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_max_rows_and_max_documents_zero_or_invalid(tmp_path, limit):
    gap, cu = gap_file(tmp_path, row(1), row(2)), corefud_file(tmp_path)
    if limit == 0 and limit is not True:
        assert list(read_gap(gap, max_rows=0)) == []
        assert list(read_corefud(cu, max_documents=0)) == []
        return
    with pytest.raises(ValueError, match=f"max_rows must be a non-negative int or None, got {limit!r}"):
        read_gap(gap, max_rows=limit)
    with pytest.raises(ValueError, match=f"max_documents must be a non-negative int or None, got {limit!r}"):
        read_corefud(cu, max_documents=limit)
    assert len(list(read_gap(gap, max_rows=1))) == 1 and len(list(read_corefud(cu, max_documents=1))) == 1


@pytest.mark.parametrize("bad, expected", [
    (dict(a_c="TRUE", b_c="TRUE"), "A-coref and B-coref are both TRUE"),
    (dict(b=("Hobhouse", 0)), "A and B are the same span 'Hobhouse' at offset 0"),
    (dict(pron=("Hob", 0)), "the pronoun 'Hob' at offset 0 overlaps A 'Hobhouse'"),
    (dict(pron=("Leach", 30)), "the pronoun 'Leach' at offset 30 overlaps B 'Bernard Leach'"),
])
def test_gap_contradictory_rows_are_refused(tmp_path, bad, expected):
    path = gap_file(tmp_path, row(1), row(2, **bad))
    with pytest.raises(ValueError, match=f"{path}:3: {expected}"):
        list(read_gap(path))


def test_corefud_block_of_comments_only_reads_as_no_sentence(tmp_path):
    # found by the loader fuzzing: a file that is one "#" line gave a raw "not enough values to unpack"
    path = tmp_path / "c.conllu"
    path.write_text("#\n")
    assert list(read_corefud(path)) == []
    path.write_text(CONLLU + "# newdoc id = trailing\n")
    assert [d.doc_id for d in read_corefud(path)] == ["d1"]
