//! The kernels written for one instruction set each, below the portable
//! definitions ([`super::reference`], and the kernels written on pulp's
//! vectors, [`super::blocks_f32`], [`super::dense`]) and chosen by
//! [`super::dispatch`].

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
