"""The least-squares decoder of a trained code (``saes.decoder_refit``) and the entropy recipe's
use of it: the code never moves, the decoder becomes the regression's, and only when it is
better on training states held back."""

import pytest
import torch

from sae_lens_bae.entropy import EntropyRecipe, code_entropy, directional_data, estimate_entropies
from sae_lens_bae.saes.bae import BAETrainingSAE, BAETrainingSAEConfig
from sae_lens_bae.saes.decoder_refit import least_squares_decoder, refit_decoder


def _lstsq(codes: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: LAPACK's SVD least squares on [codes, 1] in fp64 (``gelsd``: the default
    ``gelsy`` missed the optimum on a rank-deficient code here)."""
    design = torch.cat([codes.double(), torch.ones(len(codes), 1, dtype=torch.float64)], 1)
    solution = torch.linalg.lstsq(design, targets.double(), driver="gelsd").solution
    return solution[:-1], solution[-1]


def _bae(d_in: int = 6, d_sae: int = 12, seed: int = 0, **kwargs) -> BAETrainingSAE:
    torch.manual_seed(seed)
    bae = BAETrainingSAE(BAETrainingSAEConfig(d_in=d_in, d_sae=d_sae, **kwargs))
    with torch.no_grad():  # thresholds spread, so every bit fires on some states
        if bae.b_enc is not None:
            bae.b_enc.copy_(torch.linspace(-0.3, 0.3, bae.cfg.n_bits))
        bae.W_dec.mul_(3.0)  # a decoder far from the code's best one
    return bae


def test_the_normal_equations_match_lapack_on_a_full_rank_design():
    generator = torch.Generator().manual_seed(0)
    codes = (torch.rand(300, 20, generator=generator) < 0.3).float()
    targets = torch.randn(300, 7, generator=generator, dtype=torch.float64)
    w, b = least_squares_decoder(codes, targets, chunk=64)  # chunks that do not divide 300
    w_ref, b_ref = _lstsq(codes, targets)
    torch.testing.assert_close(w, w_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b, b_ref, rtol=1e-6, atol=1e-7)


def test_a_dead_and_a_duplicated_bit_get_the_minimum_norm_answer():
    """A bit that never fires gets a zero row; two equal bits share their row: the
    ridge's answer where the normal equations are singular."""
    generator = torch.Generator().manual_seed(1)
    codes = (torch.rand(400, 5, generator=generator) < 0.5).float()
    codes[:, 3] = 0.0
    codes[:, 4] = codes[:, 0]
    targets = torch.randn(400, 3, generator=generator, dtype=torch.float64)
    w, b = least_squares_decoder(codes, targets)
    w_ref, b_ref = _lstsq(codes[:, [0, 1, 2]], targets)
    assert torch.equal(w[3], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(w[0], w[4], rtol=0, atol=1e-7)
    torch.testing.assert_close(w[0] + w[4], w_ref[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w[1:3], w_ref[1:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b, b_ref, rtol=1e-6, atol=1e-6)


def test_a_ridge_pulls_towards_the_prior_as_the_augmented_system_does():
    """``ridge`` and ``prior``: the least squares of [X; sqrt(ridge) I] against [Y; sqrt(ridge)
    prior], the textbook form of a ridge around a point, solved by LAPACK."""
    generator = torch.Generator().manual_seed(6)
    codes = (torch.rand(200, 9, generator=generator) < 0.1).float()
    targets = torch.randn(200, 4, generator=generator, dtype=torch.float64)
    prior = torch.randn(10, 4, generator=generator, dtype=torch.float64)
    ridge = 7.0
    w, b = least_squares_decoder(codes, targets, ridge=ridge, prior=prior)
    design = torch.cat([codes.double(), torch.ones(200, 1, dtype=torch.float64)], 1)
    stacked = torch.cat([design, ridge**0.5 * torch.eye(10, dtype=torch.float64)])
    wanted = torch.linalg.lstsq(stacked, torch.cat([targets, ridge**0.5 * prior]),
                                driver="gelsd").solution  # fmt: skip
    torch.testing.assert_close(torch.cat([w, b[None]]), wanted, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("frame", [None, 0.5])
def test_the_refit_is_the_regression_and_leaves_the_code(frame):
    """With or without an input frame (the encoder reads k (x + t), the decoder's output is
    unframed): afterwards the reconstruction is the least-squares fit of the states on the code
    (with no ridge to choose from: LAPACK's; with the default ridges: the one chosen, around the
    trained decoder), and the code is the same."""
    for ridges in [(0.0,), None]:
        bae = _bae(input_variance=frame)
        states = torch.randn(2000, 6, generator=torch.Generator().manual_seed(2)) * 2 + 1
        if frame is not None:
            from sae_lens_bae.saes.input_frame import fix_frame, module_frame

            fix_frame(module_frame(bae), states.reshape(-1, states.shape[-1]), frame)
        codes = bae.encode_bits(states)
        encoder, prior = bae.W_enc.detach().clone(), torch.cat([bae.W_dec, bae.b_dec[None]])
        scale = 1.0 if frame is None else float(bae.input_scale)
        result = refit_decoder(bae, states, **({} if ridges is None else {"ridges": ridges}))
        assert result.applied and result.refit_mse < result.trained_mse
        assert torch.equal(bae.encode_bits(states), codes) and torch.equal(bae.W_enc, encoder)
        with torch.no_grad():
            out = bae.decode(bae.encode(states)).double()
        if ridges is not None:
            assert result.ridge == 0.0
            w, b = _lstsq(codes, states)
            torch.testing.assert_close(out, codes.double() @ w + b, rtol=1e-4, atol=1e-4)
        else:  # in the framed units the decoder works in: k (x + t)
            framed = bae.process_sae_in(states)
            w, b = least_squares_decoder(codes, framed, ridge=result.ridge, prior=prior.detach())
            torch.testing.assert_close(bae.W_dec.detach(), w.float(), rtol=1e-4, atol=1e-5 * scale)
            torch.testing.assert_close(bae.b_dec.detach(), b.float(), rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("centring", [False, True])
def test_the_refit_in_chunks_is_the_refit_in_one_piece(centring):
    """``refit_decoder`` reads the code a chunk at a time (a million states never become one
    [n, d_sae] code): chunks that do not divide the fit or the held-back part give the decoder,
    the scores and the ridge of one chunk holding every state."""
    states = torch.randn(1000, 6, generator=torch.Generator().manual_seed(6)) + 0.5
    results, decoders = [], []
    for chunk in [4096, 37]:
        bae = _bae(apply_b_dec_to_input=centring)
        results.append(refit_decoder(bae, states, chunk=chunk))
        decoders.append(torch.cat([bae.W_dec, bae.b_dec[None]]).detach())
    (whole, pieces), (w_whole, w_pieces) = results, decoders
    assert whole.applied and pieces.applied and whole.ridge == pieces.ridge
    assert pieces.trained_mse == pytest.approx(whole.trained_mse, rel=1e-12)
    assert pieces.refit_mse == pytest.approx(whole.refit_mse, rel=1e-9)
    torch.testing.assert_close(w_pieces, w_whole, rtol=1e-6, atol=1e-6)


def test_a_centring_decoder_bias_is_kept():
    """With ``apply_b_dec_to_input`` the encoder reads x - b_dec: moving b_dec would move the
    code, so only W_dec is fitted (no bias column)."""
    bae = _bae(apply_b_dec_to_input=True)
    with torch.no_grad():
        bae.b_dec.copy_(torch.linspace(-1, 1, 6))
    states = torch.randn(2000, 6, generator=torch.Generator().manual_seed(3)) + 0.5
    codes, bias = bae.encode_bits(states), bae.b_dec.detach().clone()
    assert refit_decoder(bae, states, ridges=(0.0,)).applied
    assert torch.equal(bae.b_dec, bias) and torch.equal(bae.encode_bits(states), codes)
    w, _ = least_squares_decoder(codes, states - bias, with_bias=False)
    torch.testing.assert_close(bae.W_dec.detach(), w.float(), rtol=1e-5, atol=1e-5)


def test_a_decoder_that_is_already_the_regression_is_kept():
    """A decoder that is the regression on all the states: no fit on 80% of them, with any
    ridge, does better on the other 20% (which it did not see), so nothing is installed."""
    bae = _bae(d_in=6, d_sae=24)
    states = torch.randn(400, 6, generator=torch.Generator().manual_seed(4))
    w, b = least_squares_decoder(bae.encode_bits(states), states)
    with torch.no_grad():
        bae.W_dec.copy_(w)
        bae.b_dec.copy_(b)
    before = {name: p.detach().clone() for name, p in bae.named_parameters()}
    result = refit_decoder(bae, states)
    assert not result.applied and result.refit_mse > result.trained_mse
    assert all(torch.equal(p, before[name]) for name, p in bae.named_parameters())


@pytest.mark.slow
def test_the_recipe_refits_and_reports_the_error_as_trained():
    """The same training with and without ``refit_decoder``: the same bits, the error as
    trained kept beside the refitted one, which is the kept BAE's own error."""
    train, test = directional_data(3, 8, 2048, 512, seed=5)
    runs = {
        refit: estimate_entropies(
            [train],
            EntropyRecipe.of(  # no repair: its judge reads the refitted decoder, so it could differ
                expansion=2,
                steps=300,
                batch_size=128,
                converge=False,
                refit_decoder=refit,
                repair_rounds=0,
            ),
            eval_sets=[test],
            normalise=False,
            progress=False,
            bootstrap=0,
        )[0]  # fmt: skip
        for refit in (True, False)
    }
    refitted, plain = runs[True], runs[False]
    assert refitted.bits == plain.bits
    assert refitted.decoder_refits == [True] and plain.decoder_refits is None
    assert plain.trained_relative_error is None
    assert refitted.trained_relative_error == pytest.approx(plain.relative_error, rel=1e-6)
    assert refitted.relative_error < plain.relative_error
    assert refitted.relative_error == code_entropy(refitted.bae, test).relative_error
    assert torch.equal(refitted.bae.W_enc, plain.bae.W_enc)
    assert refitted.summary()["trained_relative_error"] == refitted.trained_relative_error
