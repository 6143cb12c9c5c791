"""lib/dataloader.py: BERT's masking and the frequency-only loss, on hand-made token arrays."""
import numpy as np
import pytest
import torch

from lib import dataloader


def test_masking_statistics_and_reproducibility():
    n_ordinary, mask_id, specials = 1000, 1003, [1000, 1001, 1002, 1003]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, n_ordinary, (512, 128), generator=g)
    x[:, 0], x[:, 60], x[:, -5:] = 1001, 1002, 1000  # [CLS], [SEP], trailing [PAD]
    inputs, targets, pos = dataloader.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(1))
    sel = targets != -100
    assert pos.shape == (512 * round(0.15 * 128),)  # a static count: the head's rows
    assert torch.equal(torch.sort(pos).values, sel.view(-1).nonzero().squeeze(1))  # exactly the selected positions
    eligible = x < n_ordinary
    assert not sel[~eligible].any()  # special tokens and padding are never selected
    assert torch.equal(targets[sel], x[sel])
    assert (sel.sum(1) == round(0.15 * 128)).all()  # a fixed count per row: static head shape
    assert abs(sel.sum().item() / eligible.sum().item() - 0.15) < 0.01
    masked = (inputs == mask_id) & sel
    kept = (inputs == x) & sel
    randomised = sel & ~masked & ~kept
    n = sel.sum().item()
    assert abs(masked.sum().item() / n - 0.8) < 0.01
    assert abs(randomised.sum().item() / n - 0.1) < 0.01
    assert abs(kept.sum().item() / n - 0.1) < 0.011  # includes random draws that hit the same token
    assert (inputs[randomised] < n_ordinary).all()
    assert torch.equal(inputs[~sel], x[~sel])  # unselected positions are untouched
    again = dataloader.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(1))
    other = dataloader.mask_tokens(x, 0.15, n_ordinary, mask_id, torch.Generator().manual_seed(2))
    assert torch.equal(again[0], inputs) and torch.equal(again[1], targets)
    assert not torch.equal(other[1], targets)


def test_masking_short_rows_select_only_real_tokens():
    x = torch.full((2, 40), 1000)  # mostly padding: fewer eligible tokens than the per-row count
    x[:, :3] = torch.tensor([5, 6, 7])
    _, targets, pos = dataloader.mask_tokens(x, 0.15, 1000, 1003, torch.Generator().manual_seed(0))
    assert ((targets != -100).sum(1) == 3).all()
    assert pos.numel() == 2 * 6 and (targets.view(-1)[pos] != -100).sum() == 6  # 3 padding rows per sequence


def test_frequency_only_loss_by_hand():
    """U, worked out by hand (as studies/jobs.py's unigram_loss), and the same from evenly spaced train blocks when the
    train split is larger than max_tokens."""
    # ordinary ids 0..3, specials 4..7; train: 0 x4, 1 x2, 2 x1, 3 x0 and specials; blocks of 4
    train = np.array([[6, 0, 0, 0], [0, 1, 1, 2], [7, 4, 4, 4], [4, 4, 4, 4]], dtype=np.uint16)
    val = np.array([[6, 0, 1, 3], [7, 4, 4, 4]], dtype=np.uint16)
    p = np.array([5, 3, 2, 1]) / 11  # add-one smoothed counts of 0..3
    assert dataloader.frequency_only_loss(train, val, 4) == pytest.approx(-np.log(p[[0, 1, 3]]).mean())
    u = dataloader.frequency_only_loss(train, val, 4, max_tokens=8)  # blocks 0 and 2: 0 x3
    assert u == pytest.approx(-np.log(np.array([4, 1, 1, 1])[[0, 1, 3]] / 7).mean())
