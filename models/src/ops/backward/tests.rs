//! Each backward pass against burn autodiff of its operation's tensor form
//! (`Autodiff<Flex>`): the gradient of `Σ y ⊙ dy` with respect to the
//! inputs, for a fixed non-trivial `dy`. Both sides are f32; the tolerances
//! allow for sums taken in different orders.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};

use super::*;
use crate::layers::rms_norm::rms_norm_host;
use crate::layers::rope::rotate_host;
use crate::layers::{RmsNorm, Rope, RopeScaling};

type AB = Autodiff<Flex>;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "{what}: zero reference");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{what}[{i}]: {g} vs {w}");
    }
}

fn grad_of<const D: usize>(
    t: &Tensor<AB, D>,
    grads: &<AB as burn::tensor::backend::AutodiffBackend>::Gradients,
) -> Vec<f32> {
    t.grad(grads)
        .expect("a gradient")
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn rms_norm_backward_matches_autodiff() {
    let (rows, width, eps) = (5, 40, 1e-5);
    let dev = Default::default();
    let xs = values(rows * width, 1);
    let gain: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 / width as f32).collect();
    let dy = values(rows * width, 2);
    let x =
        Tensor::<AB, 2>::from_data(TensorData::new(xs.clone(), [rows, width]), &dev).require_grad();
    let norm = RmsNorm::new(Tensor::<AB, 1>::from_floats(gain.as_slice(), &dev), eps);
    let y = norm.forward(x.clone());
    let d = Tensor::<AB, 2>::from_data(TensorData::new(dy.clone(), [rows, width]), &dev);
    let grads = (y.clone() * d).sum().backward();
    let want = grad_of(&x, &grads);
    // The forward kernel agrees with the tensor form too.
    let mut out = vec![0.0; xs.len()];
    rms_norm_host(&xs, &gain, eps as f32, &mut out);
    assert_close(
        "forward",
        &out,
        &y.into_data().to_vec::<f32>().unwrap(),
        1e-6,
    );
    // Added into what `dx` held.
    let mut dx = vec![1.0; xs.len()];
    rms_norm_backward(&xs, &gain, eps as f32, &dy, &mut dx);
    let dx: Vec<f32> = dx.iter().map(|v| v - 1.0).collect();
    assert_close("dx", &dx, &want, 1e-5);
}

#[test]
fn rotate_host_backward_matches_autodiff_in_both_pairings() {
    let (batch, seq, heads, d) = (2, 5, 3, 8);
    let dev = Default::default();
    for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
        let rope = Rope::new(10_000.0, d, RopeScaling::None, style);
        let positions: Vec<Vec<usize>> =
            (0..batch).map(|b| (3 * b..3 * b + seq).collect()).collect();
        let angles = rope.angles::<AB>(&positions, &dev);
        let xs = values(batch * seq * heads * d, 3);
        let dy = values(xs.len(), 4);
        let shape = [batch, seq, heads, d];
        let x = Tensor::<AB, 4>::from_data(TensorData::new(xs.clone(), shape), &dev).require_grad();
        let y = angles.apply_seq_major(x.clone());
        let dyt = Tensor::<AB, 4>::from_data(TensorData::new(dy.clone(), shape), &dev);
        let grads = (y.clone() * dyt).sum().backward();
        let want = grad_of(&x, &grads);
        let tables = rope.host_tables(positions.iter().flatten().copied());
        let tables = (tables.0.as_slice(), tables.1.as_slice());
        let mut fwd = xs.clone();
        rotate_host(&mut fwd, heads, tables, d, 0, style);
        assert_close(
            &format!("{style:?} forward"),
            &fwd,
            &y.into_data().to_vec::<f32>().unwrap(),
            1e-6,
        );
        // The second row alone, from its first token on: `first` offsets the tables.
        let row = seq * heads * d;
        let mut got = dy.clone();
        rotate_host_backward(&mut got[..row], heads, tables, d, 0, style);
        rotate_host_backward(&mut got[row..], heads, tables, d, seq, style);
        assert_close(&format!("{style:?} dx"), &got, &want, 1e-6);
    }
}

#[test]
fn silu_gated_backward_matches_autodiff() {
    let (rows, width) = (3, 37);
    let dev = Default::default();
    let gs: Vec<f32> = values(rows * width, 5).iter().map(|v| 4.0 * v).collect();
    let us = values(rows * width, 6);
    let dy = values(rows * width, 7);
    let t =
        |v: &[f32]| Tensor::<AB, 2>::from_data(TensorData::new(v.to_vec(), [rows, width]), &dev);
    let (gate, up) = (t(&gs).require_grad(), t(&us).require_grad());
    let y = burn::tensor::activation::silu(gate.clone()) * up.clone();
    let grads = (y * t(&dy)).sum().backward();
    let (want_g, want_u) = (grad_of(&gate, &grads), grad_of(&up, &grads));
    let (mut g, mut u) = (gs.clone(), us.clone());
    silu_gated_backward(&dy, &mut g, &mut u);
    assert_close("d_gate", &g, &want_g, 1e-5);
    assert_close("d_up", &u, &want_u, 1e-5);
}
