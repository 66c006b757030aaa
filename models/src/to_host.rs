//! Reading a tensor's values into host memory (a leaf module).

use burn::tensor::{Tensor, backend::Backend};

use crate::error::ModelError;

/// Copies a float tensor to a host vector.
pub fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>, ModelError> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| ModelError::bad_input(format!("reading tensor data: {e:?}")))
}
