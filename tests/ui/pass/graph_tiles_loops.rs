// `tiles` partitions with a tile shape known at compile time and a piece count that is the
// run's: loops over them (a named partition, an inline one, a 2-D grid of tiles), pieces of
// other tiled partitions at the loop's index, placements from the index, and `graph_for`.
use simpler::{dsl::In, dsl::Out, dsl::TaskGraph, callable, task_graph};

#[callable(chip)]
fn double(x: In<f32>, mut y: Out<f32>) {
    for (o, v) in y.iter_mut().zip(x.iter()) {
        *o = 2.0 * v;
    }
}

#[callable(sub)]
fn add(a: In<f32>, b: In<f32>, mut c: Out<f32>) {
    for ((o, x), y) in c.iter_mut().zip(a.iter()).zip(b.iter()) {
        *o = x + y;
    }
}

#[callable(sub)]
fn sum(y: In<f32>, mut total: Out<f32>) {
    total[0] = y.iter().sum();
}

const ROWS: u32 = 16;
const COLS: u32 = 8;

task_graph! {
    /// A named partition, and another indexed at the loop's index.
    fn named(x: In<f32>, y: Out<f32>, total: Out<f32>) {
        let xs = x.tiles([ROWS, COLS]);
        let ys = y.tiles([ROWS, COLS]);
        for (i, xt) in xs {
            double(xt, &mut ys[i]).on(chip(i % 2));
        }
        sum(y, &mut total).on(sub());
    }
}

task_graph! {
    /// An inline partition, an intermediate per tile, and two read partitions.
    fn inline(a: In<f32>, b: In<f32>, c: Out<f32>) {
        let bs = b.tiles([ROWS]);
        let cs = c.tiles([ROWS]);
        for (i, at) in a.tiles([ROWS]) {
            let h = alloc::<f32>([ROWS]);
            double(at, &mut h).on(chip(i % 2));
            add(h, bs[i], &mut cs[i]).on(sub());
        }
    }
}

fn main() {
    // 64 x 16 in 16 x 8 tiles: a 4 x 2 grid, eight tasks, each feeding the sum.
    let g: TaskGraph = named::graph_for(&[64, 16], &[64, 16], &[1]).unwrap();
    assert_eq!((g.graph().node_count(), g.graph().edge_count()), (9, 8));
    let g = inline::graph_for(&[48], &[48], &[48]).unwrap();
    assert_eq!((g.graph().node_count(), g.graph().edge_count()), (6, 3));
    assert!(inline::graph_for(&[48], &[32], &[48]).is_err());
}
