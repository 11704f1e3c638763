// Partitions and loops expand in a module without the prelude: the generated code (the loop,
// the pieces, the static edges, the replay's computed placements) names everything by
// absolute path.
#![no_implicit_prelude]

mod kernels {
    #![no_implicit_prelude]

    use ::simpler::{In, InOut, Out};

    #[::simpler::callable(chip)]
    pub fn scale(x: In<f32>, mut y: Out<f32>) {
        y.copy_from_slice(&x);
    }

    #[::simpler::callable(sub)]
    pub fn acc(mut total: InOut<f32>, x: In<f32>) {
        let _ = (&mut total, x);
    }

    #[::simpler::callable(sub)]
    pub fn zero(mut total: Out<f32>) {
        total.fill(0.0);
    }

    pub const TILES: u32 = 4;

    ::simpler::task_graph! {
        pub fn g(x: In<f32>, total: Out<f32>) {
            let parts = alloc::<f32>([TILES * 4]);
            let ps = parts.split(TILES);
            zero(&mut total).on(sub());
            for (i, xt) in x.split(TILES) {
                scale(xt, &mut ps[i]).on(chip(i % 2));
                acc(&mut total, ps[i]).on(sub());
            }
        }
    }
}

fn main() {
    ::std::assert_eq!(kernels::g::graph().graph().node_count(), 9);
}
