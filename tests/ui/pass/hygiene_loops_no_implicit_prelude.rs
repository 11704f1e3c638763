// Partitions and loops expand in a module without the prelude: the generated code (the loop,
// the pieces, the static edges, the replay's computed placements) names everything by
// absolute path. So do `tiles` loops (their counts and their check).
#![no_implicit_prelude]

mod kernels {
    #![no_implicit_prelude]

    use ::simpler::{dsl::In, dsl::InOut, dsl::Out};

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

    // Tiles: the run-time counts and the loop's count check, by absolute path too.
    ::simpler::task_graph! {
        pub fn t(x: In<f32>, y: Out<f32>) {
            let ys = y.tiles([TILES]);
            for (i, xt) in x.tiles([TILES]) {
                scale(xt, &mut ys[i]).on(chip(i % 2));
            }
        }
    }
}

fn main() {
    ::std::assert_eq!(kernels::g::graph().graph().node_count(), 9);
    let t = kernels::t::graph_for(&[16], &[16]).unwrap();
    ::std::assert_eq!(t.graph().node_count(), 4);
}
