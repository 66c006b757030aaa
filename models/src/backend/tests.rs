use super::*;
use crate::plan::{ExecutionPlan, Route};

#[test]
fn dense_layouts_are_permutations_of_row_major() {
    assert!(lays_out_densely(&[3, 4], &[4, 1]));
    assert!(lays_out_densely(&[3, 4], &[1, 3]));
    assert!(lays_out_densely(&[2, 3, 4], &[1, 8, 2]));
    assert!(!lays_out_densely(&[3, 4], &[1, 4]), "overlapping rows");
    assert!(!lays_out_densely(&[3, 4], &[8, 1]), "a gap after each row");
    assert!(!lays_out_densely(&[3, 4], &[4, 2]), "no unit stride");
}

/// The plan reads each backend's kind from its type.
#[cfg(feature = "flex")]
#[test]
fn the_plan_reads_the_kind_of_each_backend() {
    use burn::backend::Flex;
    assert_eq!(<Flex as ModelBackend>::KIND, BackendKind::HostMemory);
    let flex = ExecutionPlan::for_backend::<Flex>(Route::Fastest).with_host_training::<Flex>(None);
    assert_eq!(flex.backend, BackendKind::HostMemory);
    assert!(flex.products.cpu_kernels && flex.host_kv && !flex.host_training);
    #[cfg(feature = "autodiff")]
    {
        use burn::backend::Autodiff;
        assert_eq!(<Autodiff<Flex> as ModelBackend>::KIND, BackendKind::Device);
        type Twice = Autodiff<Autodiff<Flex>>;
        let twice =
            ExecutionPlan::for_backend::<Twice>(Route::Fastest).with_host_training::<Twice>(None);
        assert!(
            !twice.host_training,
            "autodiff over autodiff is not host memory"
        );
        let autodiff = ExecutionPlan::for_backend::<Autodiff<Flex>>(Route::Fastest)
            .with_host_training::<Autodiff<Flex>>(None);
        assert_eq!(autodiff.backend, BackendKind::Device);
        assert!(!autodiff.products.cpu_kernels);
        assert!(autodiff.host_training);
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn the_plan_reads_wgpu_as_a_device() {
    use burn::backend::Wgpu;
    assert_eq!(<Wgpu as ModelBackend>::KIND, BackendKind::Device);
    let plan = ExecutionPlan::for_backend::<Wgpu>(Route::Fastest).with_host_training::<Wgpu>(None);
    assert_eq!(plan.backend, BackendKind::Device);
    assert!(!plan.products.cpu_kernels && !plan.host_kv && !plan.host_training);
}

#[cfg(feature = "flex")]
mod flex {
    use burn::backend::Flex;
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};

    use super::*;

    fn view<B: ModelBackend, const D: usize>(t: &Tensor<B, D>) -> Option<HostF32> {
        match t.clone().into_primitive() {
            TensorPrimitive::Float(p) => B::host_f32(&p),
            TensorPrimitive::QFloat(_) => None,
        }
    }

    fn tensor(rows: usize, cols: usize) -> Tensor<Flex, 2> {
        let v: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 3.0).collect();
        Tensor::from_data(TensorData::new(v, [rows, cols]), &Default::default())
    }

    #[test]
    fn a_view_sees_the_values_to_data_sees() {
        let t = tensor(5, 7);
        let v = view(&t).expect("an f32 flex tensor");
        assert_eq!(v.shape(), &[5, 7]);
        assert_eq!(v.strides(), &[7, 1]);
        let want = t.clone().into_data().to_vec::<f32>().unwrap();
        assert_eq!(v.values_with_strides(&[7, 1]).unwrap(), &want[..]);
        // Asked for another layout than the tensor's: no values.
        assert!(v.values_with_strides(&[1, 5]).is_none());
        assert!(v.values_with_strides(&[7]).is_none());
    }

    #[test]
    fn a_transposed_or_narrowed_view_reads_the_storage_it_shares() {
        let t = tensor(6, 4);
        let rows = t.clone().into_data().to_vec::<f32>().unwrap();
        // `[4, 6]` over the same storage, strides `[1, 4]`: the values in
        // storage order are `t`'s rows.
        let tt = t.clone().transpose();
        let v = view(&tt).expect("a transposed view");
        assert_eq!(v.strides(), &[1, 4]);
        assert_eq!(v.values_with_strides(&[1, 4]).unwrap(), &rows[..]);
        // Rows 2..5 of `t`: a run in the middle of the storage.
        let part = t.clone().narrow(0, 2, 3);
        let v = view(&part).expect("a narrowed view");
        assert_eq!(v.values_with_strides(&[4, 1]).unwrap(), &rows[8..20]);
        assert_eq!(
            v.values_with_strides(&[4, 1]).unwrap(),
            &part.into_data().to_vec::<f32>().unwrap()[..]
        );
        // Columns 1..3: not one run of the storage, whatever the strides.
        let cols = t.narrow(1, 1, 2);
        let v = view(&cols).expect("a column slice");
        assert_eq!(v.strides(), &[4, 1]);
        assert!(v.values_with_strides(&[4, 1]).is_none());
        assert!(v.values_with_strides(&[2, 1]).is_none());
    }

    #[test]
    fn other_dtypes_have_no_f32_view() {
        let f16 = tensor(2, 3).cast(burn::tensor::DType::F16);
        assert!(view(&f16).is_none());
    }

    #[cfg(feature = "autodiff")]
    #[test]
    fn autodiff_views_its_inner_tensor() {
        use burn::backend::Autodiff;
        let t = tensor(3, 2);
        let want = t.clone().into_data().to_vec::<f32>().unwrap();
        let a = Tensor::<Autodiff<Flex>, 2>::from_inner(t).require_grad();
        let v = view(&a).expect("autodiff over flex");
        assert_eq!(v.values_with_strides(&[2, 1]).unwrap(), &want[..]);
    }
}
