use codegen_cpu::Jit;
use cranelift_codegen::ir::types::*;
use cranelift_codegen::ir::{Function, InstBuilder, MemFlagsData, UserFuncName};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

fn main() {
    let mut jit = Jit::new().unwrap();
    jit.keep_disasm(true);
    let sig = jit.signature(&[I64, I64]);
    let mut func = Function::with_name_signature(UserFuncName::default(), sig);
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut fb = FunctionBuilder::new(&mut func, &mut fctx);
        let b = fb.create_block();
        fb.append_block_params_for_function_params(b);
        fb.switch_to_block(b);
        fb.seal_block(b);
        let p = fb.block_params(b).to_vec();
        let fl = MemFlagsData::new().with_notrap();
        let raw = fb.ins().load(I8X16, fl, p[0], 32);
        let c = fb.func.dfg.constants.insert(vec![15u8; 16].into());
        let mask = fb.ins().vconst(I8X16, c);
        let lo = fb.ins().band(raw, mask);
        let x = fb.ins().load(I32, fl, p[0], 0);
        let s = fb.ins().splat(I32X4, x);
        let ef = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        let s8 = fb.ins().bitcast(I8X16, ef, s);
        let y = fb.ins().x86_pmaddubsw(s8, lo);
        let r16 = fb.ins().bitcast(I16X8, ef, raw);
        let sh = fb.ins().ushr_imm_u(r16, 4);
        let sh8 = fb.ins().bitcast(I8X16, ef, sh);
        let mask2 = fb.ins().vconst(I8X16, c);
        let hi = fb.ins().band(sh8, mask2);
        let x2 = fb.ins().load(I32, fl, p[0], 4);
        let s2 = fb.ins().splat(I32X4, x2);
        let s28 = fb.ins().bitcast(I8X16, ef, s2);
        let y2 = fb.ins().x86_pmaddubsw(s28, hi);
        let z = fb.ins().iadd(y, y2);
        fb.ins().store(fl, z, p[1], 0);
        fb.ins().return_(&[]);
        fb.finalize(jit.frontend_config());
    }
    jit.define("f", func).unwrap();
    println!("{}", jit.disasm("f").unwrap());
}
