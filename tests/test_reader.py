"""Reader unit tests on tiny hand-computed inputs."""
import numpy as np
import pytest

from data import ptb


def test_vocab_sorted_by_count_then_word(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("b a b\nc b a\n")
    words = ptb.read_words(str(f))
    assert words == ["b", "a", "b", "<eos>", "c", "b", "a", "<eos>"]
    # b:3, <eos>:2, a:2, c:1 -> ties (<eos>, a) broken by the word itself
    assert ptb.build_vocab(words) == {"b": 0, "<eos>": 1, "a": 2, "c": 3}


def test_unknown_word_maps_to_unk_or_fails():
    assert list(ptb.to_ids(["x", "zz"], {"x": 0, "<unk>": 1})) == [0, 1]
    with pytest.raises(ptb.DataError, match="not in the training vocabulary"):
        ptb.to_ids(["zz"], {"x": 0})


def test_windows_hand_computed():
    ids = np.arange(13)  # batch 2 -> rows [0..5], [6..11]; token 12 dropped
    x, y = ptb.windows(ids, batch_size=2, num_steps=2)
    # row length 6 -> (6 - 1) // 2 = 2 windows
    assert x.shape == (2, 2, 2)
    np.testing.assert_array_equal(x[0], [[0, 1], [6, 7]])
    np.testing.assert_array_equal(y[0], [[1, 2], [7, 8]])
    np.testing.assert_array_equal(x[1], [[2, 3], [8, 9]])
    np.testing.assert_array_equal(y[1], [[3, 4], [9, 10]])


def test_windows_too_short_is_a_clear_error():
    with pytest.raises(ptb.DataError, match="too short for one window"):
        ptb.windows(np.arange(10), batch_size=4, num_steps=5, name="train")


@pytest.mark.parametrize("size", [1, 2, 4, 5])
def test_shards_are_disjoint_and_cover_the_batch(size):
    batch = np.arange(3 * 20 * 4).reshape(3, 20, 4)  # [steps, B=20, num_steps]
    shards = [ptb.shard(batch, r, size) for r in range(size)]
    assert all(s.shape == (3, 20 // size, 4) for s in shards)
    np.testing.assert_array_equal(np.concatenate(shards, axis=1), batch)
    seen = np.concatenate([s.ravel() for s in shards])
    assert len(np.unique(seen)) == batch.size
    np.testing.assert_array_equal(shards[-1], batch[:, 20 - 20 // size:])


def test_shard_divisibility_error():
    with pytest.raises(ptb.DataError, match="not divisible by 3 workers"):
        ptb.shard(np.zeros((1, 20, 2)), 0, 3)
    with pytest.raises(ptb.DataError, match="more workers than batch rows"):
        ptb.check_shardable(20, 40)


def test_non_utf8_and_empty_files(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xff world\n")
    with pytest.raises(ptb.DataError, match=r"not UTF-8 .*offset 6"):
        ptb.read_words(str(bad))
    for name in ptb.FILES:
        (tmp_path / name).write_text("" if name == "ptb.train.txt" else "a b\n")
    with pytest.raises(ptb.DataError, match="ptb.train.txt is empty"):
        ptb.load_corpus(str(tmp_path))


def test_real_files(ptb_path):
    import os
    for name, md5 in ptb.MD5.items():
        assert ptb.md5_of(os.path.join(ptb_path, name)) == md5
    corpus = ptb.load_corpus(ptb_path)
    assert len(corpus.vocab) == 10000
    assert len(corpus.train) == 929589
    assert (len(corpus.valid), len(corpus.test)) == (73760, 82430)
    assert corpus.vocab["the"] == 0 and corpus.vocab["<eos>"] < 5
