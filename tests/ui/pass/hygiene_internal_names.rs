// The macros' internal names (`__o`, `__g`, `__c`, `__args`, `__t0`) do not clash with the
// user's names of the same spelling.
use simpler::{dsl::In, Orchestrator, dsl::Out, dsl::TensorOf, callable, dsl::sub, task_graph};

#[callable(sub)]
fn copy(__c: In<f32>, mut __args: Out<f32>, __o: u32) {
    let _ = __o;
    __args.copy_from_slice(&__c);
}

#[callable(orch)]
fn plan(__o: &mut Orchestrator<'_>, __c: In<f32>, __args: Out<f32>) -> simpler::Result<()> {
    copy::call(&__c, &mut __args, 1)?.on(__o, sub())?;
    Ok(())
}

task_graph! {
    fn g(__c: In<f32>, __o: Out<f32>, __g: u32) {
        let __t0 = alloc::<f32>([__g]);
        let __args = __g + 1;
        copy(__c, &mut __t0, __args).on(sub());
        copy(__t0, &mut __o, __g).on(sub());
    }
}

fn demo(o: &mut Orchestrator<'_>, __c: TensorOf<f32>, mut __o: TensorOf<f32>) -> simpler::Result<()> {
    let __t0 = copy::call(&__c, &mut __o, 3)?.on(o, sub())?;
    let _ = __t0;
    g::call(&__c, &mut __o, 4)?;
    Ok(())
}

fn main() {
    let _ = demo;
    let _ = g::graph();
}
