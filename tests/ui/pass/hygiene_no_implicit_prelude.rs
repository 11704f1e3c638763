// Both macros expand in a module without the prelude: the generated code names everything
// by absolute path.
#![no_implicit_prelude]

mod kernels {
    #![no_implicit_prelude]

    use ::simpler::{dsl::In, dsl::InOut, Orchestrator, dsl::Out};

    #[::simpler::callable(sub)]
    pub fn copy(a: In<f32>, mut b: Out<f32>) {
        b.copy_from_slice(&a);
    }

    #[::simpler::callable(sub)]
    pub fn inc(mut x: InOut<f32>) -> ::core::result::Result<(), ::std::string::String> {
        for v in x.iter_mut() {
            *v += 1.0;
        }
        ::core::result::Result::Ok(())
    }

    #[::simpler::callable(chip)]
    pub fn vcopy(a: In<f32>, mut b: Out<f32>, k: u32) {
        let _ = k;
        b.copy_from_slice(&a);
    }

    #[::simpler::callable(orch)]
    pub fn plan(o: &mut Orchestrator<'_>, a: In<f32>, y: Out<f32>) -> ::simpler::Result<()> {
        copy::call(&a, &mut y)?.on(o, ::simpler::dsl::sub())?;
        ::core::result::Result::Ok(())
    }

    ::simpler::task_graph! {
        pub fn g(a: In<f32>, y: Out<f32>, y0: Out<f32>, y1: Out<f32>, n: u32) {
            let h = alloc::<f32>([n]);
            copy(a, &mut h).on(sub());
            scope(|| {
                let t = alloc::<f32>([n]);
                copy(h, &mut t).on(sub());
                copy(t, &mut y).on(sub());
            });
            inc(&mut y).on(sub());
            group(|| {
                vcopy(h, &mut y0, 1).on(chip(0));
                vcopy(h, &mut y1, 2).on(chip(1));
            });
        }
    }
}

fn main() {
    let _ = kernels::g::graph();
    let _ = kernels::plan::DIGEST;
}
