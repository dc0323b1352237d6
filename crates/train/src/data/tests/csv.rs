//! The CSV reader: round trips, what it tolerates, and every fault named with line and column.

use super::*;

/// `data` as a CSV with a header, the target last (regression data of width 1 or classes).
fn csv_of(data: &Dataset) -> String {
    let mut text: Vec<String> = (0..data.features).map(|i| format!("x{i}")).collect();
    text.push("target".to_string());
    let mut out = text.join(",") + "\n";
    for i in 0..data.len() {
        let (x, y) = data.gather(&[i]);
        let mut row: Vec<String> = x.iter().map(f32::to_string).collect();
        row.push(match y {
            Targets::Values { data, .. } => data[0].to_string(),
            Targets::Classes { data, .. } => data[0].to_string(),
        });
        out += &(row.join(",") + "\n");
    }
    out
}

#[test]
fn csv_round_trips_both_target_kinds() {
    for (data, task) in [
        (regression_preset(200, 3, 9), Task::Regression),
        (classification_preset(200, 2, 9), Task::Classification),
        (small_classes(), Task::Classification),
    ] {
        let loaded = load_bytes("d.csv", csv_of(&data).as_bytes(), task).unwrap();
        assert_eq!(loaded, data);
    }
}

#[test]
fn csv_reads_quotes_spaces_blank_lines_and_any_case_extension() {
    let text = "\"a\", b ,label\n\n\"1.5\", -2e1 , 3 \n4,5,0\n";
    let d = load_bytes("D.CSV", text.as_bytes(), Task::Classification).unwrap();
    assert_eq!(d.features, 2);
    assert_eq!(d.x, [1.5, -20.0, 4.0, 5.0]);
    assert_eq!(
        d.y,
        Targets::Classes {
            classes: 4,
            data: vec![3, 0]
        }
    );
    // one class seen still makes a classifier of two
    let d = load_bytes("d.csv", b"a,y\n1,0\n2,0\n", Task::Classification).unwrap();
    assert_eq!(
        d.y,
        Targets::Classes {
            classes: 2,
            data: vec![0, 0]
        }
    );
    let d = load_bytes("d.csv", b"a,y\n1,0.5\n", Task::Regression).unwrap();
    assert_eq!(
        d.y,
        Targets::Values {
            width: 1,
            data: vec![0.5]
        }
    );
}

#[test]
fn csv_faults_are_named_with_line_and_column() {
    let r = Task::Regression;
    let c = Task::Classification;
    let ragged = "a,b,c,y\n1,2,3,4\n1,2,3,4\n1,2,3,4\n1,2,3,4\n1,2,3,4\n1,2,3\n";
    refused(
        "d.csv",
        ragged.as_bytes(),
        r,
        "line 7 has 3 fields, the header has 4",
    );
    refused(
        "d.csv",
        b"a,y\n1,2,3\n",
        r,
        "line 2 has 3 fields, the header has 2",
    );
    refused(
        "d.csv",
        b"a,y\n1,2\n   \n",
        r,
        "line 3 has 1 field, the header has 2",
    );
    refused(
        "d.csv",
        b"age,y\n1,2\n abc ,3\n",
        r,
        "line 3, column \"age\": \"abc\" is not a number",
    );
    refused(
        "d.csv",
        b"age,y\n1,\n",
        r,
        "line 2, column \"y\": \"\" is not a number",
    );
    refused(
        "d.csv",
        b"a,y\n\xff\xfe,1\n",
        c,
        "line 2, column \"a\": \"\u{fffd}\u{fffd}\" is not a number",
    );
    refused("d.csv", b"a,y\n", r, "no data rows after the header");
    refused("d.csv", b"a,y\n\n\n", c, "no data rows after the header");
    refused("d.csv", b"", r, "empty file");
    refused("d.csv", b" \n\t\n", c, "empty file");
    refused(
        "d.csv",
        b"y\n1\n2\n",
        r,
        "needs at least 2 columns (features, then the target)",
    );
    let labels = "a,label\n1,0\n2,1\n3,0\n4,1.5\n";
    refused(
        "d.csv",
        labels.as_bytes(),
        c,
        "line 5, column \"label\": 1.5 is not a class index (a non-negative integer)",
    );
    refused("d.csv", b"a,label\n1,-1\n", c, "-1 is not a class index");
    refused(
        "d.csv",
        b"a,label\n1,4000000000\n",
        c,
        "4000000000 is above the largest class index",
    );
    refused(
        "d.csv",
        b"a,label\n1,NaN\n",
        c,
        "line 2, column \"label\" is NaN",
    );
    refused(
        "d.csv",
        b"a,x2,y\n1,2,3\n1,2,3\n1,nan,3\n",
        r,
        "line 4, column \"x2\" is NaN",
    );
    refused(
        "d.csv",
        b"a,x2,y\n1,inf,3\n",
        r,
        "line 2, column \"x2\" is inf",
    );
    refused(
        "d.csv",
        b"a,x2,y\n1,-infinity,3\n",
        r,
        "line 2, column \"x2\" is -inf",
    );
    refused(
        "d.csv",
        b"a,y\n1,1e39\n",
        r,
        "line 2, column \"y\": 1e39 is beyond f32's range",
    );
    refused(
        "d.csv",
        b"a,y\n1,1e99999\n",
        c,
        "line 2, column \"y\" is inf",
    );
    // a quoted field spanning lines: the next record's line is still the file's
    refused(
        "d.csv",
        b"a,y\n\"1\n\",2\nz,3\n",
        r,
        "line 4, column \"a\": \"z\" is not a number",
    );
}
