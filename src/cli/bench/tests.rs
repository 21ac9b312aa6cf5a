use super::*;

#[test]
fn prism_names_fix_memory_updates_and_constraint() {
    let method = BenchMethod::parse("prism-in-place-no-updates-unconstrained").unwrap();
    assert_eq!(method.method, MethodName::Prism);
    assert_eq!(
        method.prism,
        Some(Variant {
            memory: MemoryMode::InPlace,
            updates: false,
            constrained: false
        })
    );
    let amendments = BenchMethod::parse("prism-amendments")
        .unwrap()
        .prism
        .unwrap();
    assert_eq!(amendments.memory, MemoryMode::Amendments);
    assert!(amendments.updates && amendments.constrained);
    let unconstrained = BenchMethod::parse("prism-amendments-unconstrained")
        .unwrap()
        .prism
        .unwrap();
    assert!(unconstrained.updates && !unconstrained.constrained);
}

#[test]
fn every_valid_name_parses_to_itself() {
    for name in valid_names() {
        let method = BenchMethod::parse(&name).unwrap();
        assert_eq!(method.name, name);
    }
}

#[test]
fn other_methods_parse_through_their_value_enum() {
    for method in MethodName::value_variants() {
        if *method == MethodName::Prism {
            continue;
        }
        let name = method.to_possible_value().unwrap().get_name().to_string();
        let parsed = BenchMethod::parse(&name.to_uppercase()).unwrap();
        assert_eq!(
            (parsed.method, parsed.name, parsed.prism),
            (*method, name, None)
        );
    }
}

#[test]
fn unknown_names_list_the_valid_ones() {
    for bad in [
        "prism",
        "prism-amendments-unconstrained-no-updates",
        "prism-inplace",
        "prism-amendments-",
        "nonsense",
    ] {
        let err = BenchMethod::parse(bad).unwrap_err();
        assert!(err.starts_with(&format!("unknown method `{bad}`; valid names: ")));
        assert!(err.contains("prism-amendments, prism-amendments-no-updates"));
        assert!(err.contains("prism-in-place-no-updates-unconstrained"));
    }
}

#[test]
fn names_override_the_shared_prism_flags() {
    use clap::Parser;
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        method_args: MethodArgs,
    }
    let base = Flags::parse_from(["x"]).method_args;
    let args = BenchMethod::parse("prism-in-place-no-updates-unconstrained")
        .unwrap()
        .args(&base);
    assert_eq!(args.memory, MemoryArg::InPlace);
    assert!(args.no_updates);
    assert_eq!(args.constrained, OnOff::Off);
    assert_eq!(args.query, base.query);
}
